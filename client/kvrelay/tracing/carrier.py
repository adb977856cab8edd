"""A job's W3C trace context: written into ``GenerateRequest.trace_context``, read back out.

Always the W3C Trace Context format (``traceparent``/``tracestate``), whatever
propagators the application set globally: it is the field's contract
(``kvrelay.trace_wire``), read by workers that know nothing of the caller's setup. What
would not fit the field's bounds is dropped here, so the SDK never sends a request a
worker must refuse. Only called while tracing is on: OpenTelemetry is imported inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvrelay.trace_wire import MAX_TRACE_VALUE_CHARS

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = ["TRACE_HEADERS", "bounded", "inject", "parent_context"]

# The headers of W3C Trace Context, the only ones the field carries.
TRACE_HEADERS = ("traceparent", "tracestate")

_propagator: Any = None


def _w3c() -> Any:
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    return _propagator


def inject(span: Span) -> dict[str, str] | None:
    """The W3C headers naming ``span`` as the parent of what the job's workers record."""
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    _w3c().inject(carrier, context=set_span_in_context(span))
    return bounded(carrier) or None


def bounded(carrier: Mapping[str, str]) -> dict[str, str]:
    """The W3C headers of ``carrier`` that fit the wire field (a ``tracestate`` longer than
    the field allows is dropped whole: a cut one would be malformed)."""
    return {key: value for key in TRACE_HEADERS
            if isinstance(value := carrier.get(key), str) and len(value) <= MAX_TRACE_VALUE_CHARS}


def parent_context(trace_context: Mapping[str, str] | None) -> Context:
    """The context a job's spans are parented to: the caller's span when the request
    carries a valid trace context, else an empty context (a trace of its own, never the
    current thread's context)."""
    from opentelemetry.context import Context

    if not trace_context:
        return Context()
    extracted: Context = _w3c().extract(bounded(trace_context))
    return extracted
