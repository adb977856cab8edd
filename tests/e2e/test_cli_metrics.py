"""``kvrelay metrics``: every model's queue depth for Prometheus without a gateway, as a
real process against a real Redis, with jobs queued by the SDK and no worker consuming."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import httpx
import pytest
import redis
from cli_support import background_cli, cli_env, one_line_error, run_cli, wait_no_leftovers
from helpers.prom_scrape import parse

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration


async def _queue(url: str, model: str, jobs: int, namespace: str = "") -> AsyncClient:
    """Enqueue ``jobs`` jobs for ``model``; the client (left open) keeps them queued."""
    client = AsyncClient(url, model=model, require_worker=False, namespace=namespace)
    streams = [client.stream(prompt_token_ids=[1, 2, 3], max_tokens=2) for _ in range(jobs)]
    await asyncio.gather(*(stream.start() for stream in streams))
    return client


def _llen(url: str, name: str) -> int:
    raw = redis.Redis.from_url(url)
    try:
        return int(raw.llen(name))
    finally:
        raw.close()


async def test_once_prints_each_namespace_and_model(clean_redis_url: str,
                                                    tmp_path: Path) -> None:
    clients = [await _queue(clean_redis_url, "queued", 4),
               await _queue(clean_redis_url, "theirs", 2, namespace="acme")]
    try:
        assert _llen(clean_redis_url, Keyspace().queue("queued")) == 4
        args = ["metrics", "--once", "--redis-url", clean_redis_url, "--namespace", "",
                "--namespace", "acme", "--model", "idle"]
        result = await asyncio.to_thread(run_cli, args, cli_env(tmp_path), timeout=60)
    finally:
        for client in clients:
            await client.aclose()
    assert result.returncode == 0, result.stderr
    scraped = parse(result.stdout)
    depth = {(ns, model): scraped.value("kvrelay_queue_depth", namespace=ns, model=model)
             for ns, model in [("", "queued"), ("acme", "theirs"), ("", "idle")]}
    assert depth == {("", "queued"): 4, ("acme", "theirs"): 2, ("", "idle"): 0}
    assert scraped.total("kvrelay_queue_depth") == 6  # nothing else, nowhere else
    assert scraped.value("kvrelay_model_workers", namespace="", model="queued") == 0
    assert scraped.value("kvrelay_queue_read_ok", namespace="acme") == 1


async def test_serves_the_depth_read_at_each_scrape(clean_redis_url: str,
                                                    tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    args = ["metrics", "--port", "0", "--redis-url", clean_redis_url]
    with background_cli(args, env, tmp_path / "exporter") as exporter:
        exporter.wait_for(lambda: "serving http://" in exporter.stderr, 30, "the ready line")
        found = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", exporter.stderr)
        assert found is not None, exporter.stderr
        url = f"http://127.0.0.1:{found.group(1)}"
        client = await _queue(clean_redis_url, "queued", 3)
        try:
            first = parse((await asyncio.to_thread(httpx.get, f"{url}/metrics")).text)
            await asyncio.gather(*(client.stream(prompt_token_ids=[4], max_tokens=2).start()
                                   for _ in range(2)))
            second = parse((await asyncio.to_thread(httpx.get, f"{url}/metrics")).text)
            elsewhere = await asyncio.to_thread(httpx.get, f"{url}/")
        finally:
            await client.aclose()
        queue = {"namespace": "", "model": "queued"}
        assert first.value("kvrelay_queue_depth", **queue) == 3
        assert second.value("kvrelay_queue_depth", **queue) == 5
        assert second.value("kvrelay_queue_depth", **queue) == \
            _llen(clean_redis_url, Keyspace().queue("queued"))
        assert elsewhere.status_code == 404
        exporter.send(signal.SIGTERM)
        assert exporter.wait(15) == 0, exporter.stderr
        assert "Traceback" not in exporter.stderr
    assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []


def test_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    result = run_cli(["metrics", "--once", "--redis-url", "redis://127.0.0.1:1/0"],
                     cli_env(tmp_path), timeout=60)
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert "could not read the queues of namespace (default)" in line
    assert "127.0.0.1:1" in line
    assert result.stdout == ""
