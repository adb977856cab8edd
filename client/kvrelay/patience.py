"""``patiently``: an SDK call that meets a Redis failover waits it out.

Behind sentinels a primary's death leaves a second or two with no primary, then a new
one; a write may also be refused for a while (``NOREPLICAS``, ``READONLY`` from a
demoted primary, ``LOADING``). A call made then should not fail at once: it tries again
with a short, capped backoff for up to the client's ``reconnect_timeout``, the same
patience its live streams have, and only then raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kvrelay.errors import KvrelayError
from kvrelay.redis_faults import WritesRefused, is_refusal, is_transient

T = TypeVar("T")

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5


def passing(exc: BaseException) -> bool:
    """A failure that may pass: Redis unreachable, timing out or refusing for now, here
    or behind the broker's own wrapping (kombu's ``OperationalError``, the enqueuer's
    ``BrokerUnavailable``), as the chain of causes shows."""
    seen: BaseException | None = exc
    while seen is not None:
        if is_transient(seen) or _broker_unreachable(seen):
            return True
        # The SDK's own errors (also builtin ConnectionErrors) count only by their cause.
        if isinstance(seen, OSError) and not isinstance(seen, KvrelayError):
            return True
        seen = seen.__cause__
    return False


def _broker_unreachable(exc: BaseException) -> bool:
    kind = type(exc)
    return kind.__name__ == "OperationalError" and kind.__module__.startswith("kombu")


async def patiently(call: Callable[[], Awaitable[T]], within: float) -> T:
    """``await call()``, tried again while it fails in a way that may pass, for up to
    ``within`` seconds; the last failure is raised after that (a refusal as
    ``WritesRefused``, so that callers treat it as Redis out of reach)."""
    try:
        return await retried(call, within, passing)
    except Exception as exc:
        if passing(exc) and is_refusal(exc):
            raise WritesRefused(str(exc)) from exc
        raise


async def retried(call: Callable[[], Awaitable[T]], within: float,
                  again: Callable[[Exception], bool]) -> T:
    """``await call()``, tried again with a short, capped backoff while it fails in a
    way ``again`` accepts, for up to ``within`` seconds; any other failure, and the last
    one, is raised."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + within
    delay = FIRST_DELAY_S
    while True:
        try:
            return await call()
        except Exception as exc:
            if not again(exc) or loop.time() + delay > give_up_at:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
