"""After a pub/sub reconnect, events that reach the log later are read soon, not at the
stream's timeout.

Real Redis, the scripted worker (``helpers.fake_worker``). A stream's pub/sub connection
is killed; the dispatcher reconnects and the stream reads its gap (the resync). Only
then does the rest of the job reach the log, with no publish this stream can hear: what
a worker's writes held through a failover do when they land on the new primary after the
resync's read while their publish went to the old one (chaos seed 10022). The stream
ends within a few seconds. Before, it heard nothing until its ``stream_timeout`` (the
log read at the idle limit), by which time a short ``KVRELAY_LOG_TTL`` had let the log
expire: ``StreamTimeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import (
    completion_events,
    decode_celery_message,
    play,
    remember,
    wait_until,
)

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

KEYS = Keyspace()
MODEL = "m-resync"
STREAM_TIMEOUT_S = 30.0
# The follow-up reads come 0.5, 1.5, 3.5, 7.5 and 15.5 s after the resync.
ENDS_WITHIN_S = 6.0

pytestmark = pytest.mark.timeout(60)


async def _xrange_calls(raw: aioredis.Redis) -> int:
    stats: dict[str, Any] = await raw.info("commandstats")
    return int(stats.get("cmdstat_xrange", {}).get("calls", 0))


async def test_events_logged_after_the_resync_read_arrive_soon(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    events = completion_events(list("abcdefgh"))
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False,
                           stream_timeout=STREAM_TIMEOUT_S) as client:
        stream = client.stream("x")
        async with stream:
            item = await raw.brpop([KEYS.queue(MODEL)], timeout=5)
            assert item is not None
            job = stream.job_id
            remember(decode_celery_message(item[1])[1])
            await play(raw, job, events[:3])
            texts = [(await stream.__anext__()).text for _ in range(2)]
            rest = asyncio.create_task(_texts(stream))
            reads = await _xrange_calls(raw)
            assert await raw.client_kill_filter(_type="pubsub") >= 1
            # The resync: reconnected, resubscribed, and the gap read from the log.
            async def resynced() -> bool:
                return client.dispatcher.connects >= 2 and await _xrange_calls(raw) > reads

            await wait_until(resynced, within=10)
            await asyncio.sleep(0.1)
            loop = asyncio.get_running_loop()
            logged_at = loop.time()
            await play(raw, job, events[3:], skip_publish=[e.seq for e in events[3:]])
            async with asyncio.timeout(ENDS_WITHIN_S):
                texts += await rest
            ended_after = loop.time() - logged_at
    assert "".join(texts) == "abcdefgh"
    assert ended_after < ENDS_WITHIN_S


async def _texts(stream: Any) -> list[str]:
    return [chunk.text async for chunk in stream]
