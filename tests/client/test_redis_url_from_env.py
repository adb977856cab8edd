"""A client made without a URL reads ``KVRELAY_REDIS_URL``, as workers and the CLI do."""

from __future__ import annotations

import pytest

from kvrelay import AsyncClient, Client
from kvrelay.connection import DEFAULT_REDIS_URL


async def test_async_client_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_REDIS_URL", "redis://:secret@redis-host:6380/3")
    client = AsyncClient()
    try:
        assert "redis-host:6380/3" in repr(client)
        assert "secret" not in repr(client)
    finally:
        await client.aclose()


async def test_an_explicit_url_wins_and_unset_means_localhost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVRELAY_REDIS_URL", "redis://redis-host:6380/3")
    explicit = AsyncClient("redis://other:6379/1")
    monkeypatch.delenv("KVRELAY_REDIS_URL")
    default = AsyncClient()
    try:
        assert "other:6379/1" in repr(explicit)
        assert DEFAULT_REDIS_URL in repr(default)
    finally:
        await explicit.aclose()
        await default.aclose()


def test_sync_client_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens
    client = Client(connect_timeout=0.5, reconnect_timeout=1)
    try:
        with pytest.raises(ConnectionError, match=r"127\.0\.0\.1:1"):
            client.workers()
    finally:
        client.close()
