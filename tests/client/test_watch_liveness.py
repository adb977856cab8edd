"""A watcher registration lives as long as its reader: kept alive while the watching
stream's client runs, gone ``WATCH_TTL_S`` after that client dies without leaving (until
then every worker checks each job it runs for watchers, and publishes twice for it).

Real Redis; the dying reader is a real process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import KEYS, announce, play, wait_until

from kvrelay import AsyncClient, job_lifecycle
from kvrelay.protocol import Started, Tokens

pytestmark = pytest.mark.timeout(60)

JOB = "job-watched-1"


@pytest.fixture
async def raw(clean_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(clean_redis_url)
    await announce(client, "w-1", "m", ttl_ms=60_000)
    await client.hset(KEYS.job_record(JOB), "state", "running")
    await play(client, JOB, [Started(seq=0, worker="w-1"),
                             Tokens(seq=1, token_ids=[1], text="a")])
    yield client
    await client.aclose()


async def test_a_registration_expires_soon_unless_refreshed(raw: aioredis.Redis,
                                                            clean_redis_url: str) -> None:
    async with AsyncClient(clean_redis_url, model="m") as client:
        stream = await client.resume(JOB, after_seq=1)
        async with stream:
            for key in (KEYS.watchers(JOB), KEYS.watching):
                ttl = await raw.pttl(key)
                assert 0 < ttl <= 60_000, (key, ttl)  # a minute at most, not an hour


async def test_a_live_reader_keeps_it_and_a_dead_one_lets_it_expire(
        raw: aioredis.Redis, clean_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_lifecycle, "WATCH_TTL_S", 1)
    monkeypatch.setattr(job_lifecycle, "WATCH_REFRESH_S", 0.2, raising=False)
    async with AsyncClient(clean_redis_url, model="m") as client:
        stream = await client.resume(JOB, after_seq=1)
        async with stream:
            for _ in range(12):  # 2.4 s: well past one TTL
                await asyncio.sleep(0.2)
                assert await raw.get(KEYS.watchers(JOB)) == b"1"
                assert await raw.scard(KEYS.watching) == 1
    # A reader that dies without leaving: its registration goes with its refreshes.
    script = textwrap.dedent(f"""
        import asyncio, sys
        from kvrelay import AsyncClient, job_lifecycle
        job_lifecycle.WATCH_TTL_S = 1.0
        job_lifecycle.WATCH_REFRESH_S = 0.2
        async def main():
            async with AsyncClient({clean_redis_url!r}, model="m") as client:
                stream = await client.resume({JOB!r}, after_seq=1)
                print("watching", flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
    """)
    reader = await asyncio.create_subprocess_exec(sys.executable, "-c", script,
                                                  stdout=asyncio.subprocess.PIPE)
    try:
        assert reader.stdout is not None
        line = await asyncio.wait_for(reader.stdout.readline(), 30)
        assert line.strip() == b"watching"
        await wait_until(lambda: raw.exists(KEYS.watchers(JOB)), within=5)
        os.kill(reader.pid, signal.SIGKILL)
        await asyncio.wait_for(reader.wait(), 10)
        killed = time.monotonic()
        await wait_until(lambda: _gone(raw), within=5)
        assert time.monotonic() - killed < 2.5
    finally:
        if reader.returncode is None:
            reader.kill()
            await asyncio.wait_for(reader.wait(), 10)


async def _gone(raw: aioredis.Redis) -> bool:
    return not await raw.exists(KEYS.watchers(JOB), KEYS.watching)


async def test_a_reader_that_leaves_takes_its_count_with_it(raw: aioredis.Redis,
                                                           clean_redis_url: str) -> None:
    """The last watcher to leave deletes the count: a count at zero left to expire would
    outlive the job's log (the retention rule), and one watcher leaving keeps another's."""
    async with AsyncClient(clean_redis_url, model="m") as client:
        first = await client.resume(JOB, after_seq=1)
        second = await client.resume(JOB, after_seq=1)
        async with first:
            async with second:
                assert await raw.get(KEYS.watchers(JOB)) == b"2"
            await wait_until(lambda: _count_is(raw, b"1"), 5)
        await wait_until(lambda: _gone(raw), 5)


async def _count_is(raw: aioredis.Redis, value: bytes) -> bool:
    return await raw.get(KEYS.watchers(JOB)) == value


async def _gone(raw: aioredis.Redis) -> bool:
    return not await raw.exists(KEYS.watchers(JOB))
