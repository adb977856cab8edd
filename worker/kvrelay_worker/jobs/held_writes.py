"""``until_written``: a write that must not be lost is held and sent again until it is.

The worker's writes that carry a job's state (its events, its claim, its end, a
hand-back) cannot simply fail when Redis refuses them for a while or is out of reach:
the event would be gone with its seq spent, or the job left without an end. Such a write
is retried with a short, capped backoff until Redis takes it; meanwhile the engine keeps
running and the job's output waits. A failure that is not transient (a malformed call)
is raised at once, unless ``any_error``: then every error reply is held, since a batch
of events is never dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from kvrelay.redis_faults import is_transient
from kvrelay_worker.redis_health import RedisHealth

log = logging.getLogger(__name__)

T = TypeVar("T")

# Backoff between tries: short at first (a failover's new primary is up within a second
# or two), capped low (each step past the outage's end is a stall).
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5
# While a write keeps failing, a warning every this many seconds (not one per try).
WARN_EVERY_S = 5.0


def until_written(call: Callable[[], T], what: str, health: RedisHealth | None = None, *,
                  any_error: bool = False, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``'s result once it succeeds; ``what`` names the write in the log."""
    delay = FIRST_DELAY_S
    started = time.monotonic()
    warned_at: float | None = None
    while True:
        try:
            return call()
        except redis.RedisError as exc:
            if not (is_transient(exc) or (any_error and isinstance(exc, redis.ResponseError))):
                raise
            if health is not None:
                health.failed()
            now = time.monotonic()
            if warned_at is None or now - warned_at >= WARN_EVERY_S:
                warned_at = now
                log.warning("Redis did not take %s (%s); held and retried (%.1fs so far)",
                            what, exc, now - started)
        sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
