"""Tenant policy at the gateway: priorities clamped to the tenant's ceiling, jobs in flight
and admissions per second limited per tenant (429 + Retry-After, counted in Redis in the
admission script), one tenant's limit never refusing another.

A real ``kvrelay gateway`` with two keys in one namespace, on a real Redis. The worker is
announced but takes nothing from the queue, so admitted jobs stay queued where the test
can read them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from helpers.fake_worker import KEYS, announce, decode_celery_message
from helpers.gateway_process import GatewayProcess

from kvrelay.protocol import MAX_PRIORITY

pytestmark = pytest.mark.integration

MODEL = "fake-model"
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
REQUEST = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}


@pytest.fixture
def start_gateway(tmp_path: Path,
                  clean_redis_url: str) -> Iterator[Callable[[str], GatewayProcess]]:
    asyncio.run(_announce(clean_redis_url))
    started: list[GatewayProcess] = []

    def start(config: str) -> GatewayProcess:
        path = tmp_path / f"gateway-{len(started)}.toml"
        path.write_text(config)
        gateway = GatewayProcess(clean_redis_url, tmp_path, f"gateway-{len(started)}",
                                 "--config", str(path),
                                 KVRELAY_GATEWAY_API_KEYS="sk-alice=alice,sk-bob=bob")
        started.append(gateway)
        return gateway.start()

    yield start
    for gateway in started:
        gateway.stop()


async def _announce(url: str) -> None:
    redis = aioredis.Redis.from_url(url)
    await announce(redis, "w-1", MODEL, ttl_ms=300_000)
    await redis.aclose()


def queued_priorities(redis_url: str) -> list[int]:
    redis = sync_redis.Redis.from_url(redis_url)
    try:
        return [decode_celery_message(raw)[1].priority
                for raw in redis.lrange(KEYS.queue(MODEL), 0, -1)]
    finally:
        redis.close()


@contextlib.contextmanager
def opened(gateway: GatewayProcess, headers: dict[str, str],
           **extra: Any) -> Iterator[httpx.Response]:
    """A streamed request held open (its job stays in flight until it is left)."""
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={**REQUEST, **extra},
                      headers=headers, timeout=30) as response:
        yield response


def test_a_priority_above_the_tenants_ceiling_is_clamped(
        clean_redis_url: str, start_gateway: Callable[[str], GatewayProcess]) -> None:
    gateway = start_gateway("[tenants.alice]\nmax_priority = 5\n")
    with opened(gateway, BOB, priority=MAX_PRIORITY) as bob, \
            opened(gateway, ALICE, priority=MAX_PRIORITY) as alice, \
            opened(gateway, ALICE, priority=-3) as low:
        assert (bob.status_code, alice.status_code, low.status_code) == (200, 200, 200)
        # bob (default ceiling 0) cannot outrank anyone; alice reaches her 5 at most.
        assert sorted(queued_priorities(clean_redis_url)) == [-3, 0, 5]


def test_a_tenant_past_its_jobs_limit_gets_429_while_another_is_served(
        start_gateway: Callable[[str], GatewayProcess]) -> None:
    gateway = start_gateway("[tenants.bob]\nmax_jobs = 2\n")
    with opened(gateway, BOB) as first, opened(gateway, BOB) as second:
        assert (first.status_code, second.status_code) == (200, 200)
        with opened(gateway, BOB) as third:
            assert third.status_code == 429
            third.read()
            error = third.json()["error"]
            assert error["type"] == "rate_limit_error"
            assert "bob" in error["message"]
            assert int(third.headers["retry-after"]) >= 1
        with opened(gateway, ALICE) as alice:
            assert alice.status_code == 200
    # Bob's jobs ended with their streams: he is admitted again.
    with opened(gateway, BOB) as again:
        assert again.status_code == 200


def test_a_tenant_over_its_rate_gets_429_with_the_wait(
        start_gateway: Callable[[str], GatewayProcess]) -> None:
    gateway = start_gateway("[tenants.bob]\nrequests_per_second = 0.2\n")
    with opened(gateway, BOB) as first:
        assert first.status_code == 200
    with opened(gateway, BOB) as second:
        assert second.status_code == 429
        assert int(second.headers["retry-after"]) >= 4  # one token per 5 s
    with opened(gateway, ALICE) as alice:
        assert alice.status_code == 200
