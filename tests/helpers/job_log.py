"""Read a job's event log straight from Redis (what every client would replay)."""

from __future__ import annotations

import time

import redis

from kvrelay import event_log
from kvrelay.keys import Keyspace
from kvrelay.protocol import AnyEvent, Failed, Finished, decode_event

KEYS = Keyspace()  # the default namespace


def read_events(redis_url: str, job_id: str) -> list[AnyEvent]:
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(KEYS.event_log(job_id))
        return [decode_event(data) for _, fields in entries
                if (data := event_log.event_bytes(fields)) is not None]
    finally:
        client.close()


def wait_terminal(redis_url: str, job_id: str, timeout: float = 30.0) -> list[AnyEvent]:
    """Events of a job once it has ended (Finished or Failed), or TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = read_events(redis_url, job_id)
        if events and isinstance(events[-1], (Finished, Failed)):
            return events
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not end within {timeout}s: {read_events(redis_url, job_id)}")
