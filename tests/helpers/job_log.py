"""Read a job's events straight from Redis: what every client would replay (its log, then
its owner's tail), or, for a job that ended, its log alone (the worker moves everything
there when the job ends; reading only the log keeps a test's own reads out of the tail)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import redis as sync_redis
import redis.asyncio as aioredis

from kvrelay import event_log
from kvrelay.event_frames import unpack_events
from kvrelay.keys import Keyspace
from kvrelay.protocol import AnyEvent, Failed, Finished, decode_event

KEYS = Keyspace()  # the default namespace


async def _read(redis_url: str, job_id: str, keys: Keyspace) -> list[AnyEvent]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        found = await event_log.read_after(client, keys, job_id, -1, page=256)
    finally:
        await client.aclose()
    events: dict[int, AnyEvent] = {}
    for raw in found:
        event = decode_event(bytes(raw))
        events.setdefault(event.seq, event)
    return [events[seq] for seq in sorted(events)]


def read_events(redis_url: str, job_id: str, keys: Keyspace = KEYS) -> list[AnyEvent]:
    """Callable from sync code and from inside a running event loop alike (it reads on a
    thread of its own)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _read(redis_url, job_id, keys)).result()


def read_log(redis_url: str, job_id: str, keys: Keyspace = KEYS) -> list[AnyEvent]:
    """The events in the job's log (XRANGE only)."""
    client = sync_redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(keys.event_log(job_id))
    finally:
        client.close()
    return [decode_event(bytes(raw)) for _, fields in entries
            if (data := event_log.entry_events(fields)) is not None
            for raw in unpack_events(data)]


def wait_terminal(redis_url: str, job_id: str, timeout: float = 30.0) -> list[AnyEvent]:
    """Events of a job once it has ended (Finished or Failed), or TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = read_log(redis_url, job_id)
        if events and isinstance(events[-1], (Finished, Failed)):
            return events
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not end within {timeout}s: {read_events(redis_url, job_id)}")
