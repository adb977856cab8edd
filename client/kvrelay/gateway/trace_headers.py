"""ASGI middleware: a request's W3C ``traceparent`` continues the caller's trace.

While tracing is on (``kvrelay.tracing.switch``), an HTTP request that carries
``traceparent`` (and maybe ``tracestate``) is served under that remote span, so the
job the request starts (``kvrelay.tracing.job_trace``) and every span its workers
record are in the caller's trace. When a span is already current (OpenTelemetry's own
ASGI instrumentation wraps the app and has read the header itself) nothing is changed.
While tracing is off a request costs one check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from kvrelay.tracing.carrier import TRACE_HEADERS, parent_context
from kvrelay.tracing.switch import active_tracer

__all__ = ["TraceHeaders"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_WANTED = {name.encode() for name in TRACE_HEADERS}


class TraceHeaders:
    """Wraps an ASGI app (``Starlette(middleware=[Middleware(TraceHeaders)])``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or active_tracer() is None:
            await self.app(scope, receive, send)
            return
        carrier = {name.decode(): value.decode("latin-1")
                   for name, value in scope.get("headers", ()) if name in _WANTED}
        token = _attach(carrier) if carrier else None
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                from opentelemetry import context

                context.detach(token)


def _attach(carrier: dict[str, str]) -> Any:
    """Make the caller's span current; None when one is current already or the header
    is not a valid ``traceparent``."""
    from opentelemetry import context, trace

    if trace.get_current_span().get_span_context().is_valid:
        return None
    parent = parent_context(carrier)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return context.attach(parent)
