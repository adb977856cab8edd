"""The synchronous client's calls run in its caller's trace context.

``kvrelay.Client`` runs every call on an event loop in a thread of its own, whose tasks
start from that thread's context, not the caller's: a job started inside the caller's
span would open a trace of its own. While tracing is on, ``in_callers_context`` wraps the
call so it runs under the OpenTelemetry context current in the calling thread; while it
is off the call is returned as it is (one check).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from kvrelay.tracing.switch import active_tracer

__all__ = ["in_callers_context"]

T = TypeVar("T")


def in_callers_context(coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """``coro``, run under the calling thread's trace context when tracing is on."""
    if active_tracer() is None:
        return coro
    from opentelemetry import context

    return _under(context.get_current(), coro)


async def _under(parent: Any, coro: Coroutine[Any, Any, T]) -> T:
    from opentelemetry import context

    token = context.attach(parent)
    try:
        return await coro
    finally:
        context.detach(token)
