"""The wire type of tracing: a job's W3C trace context, as ``GenerateRequest.trace_context``.

Kept apart from ``kvrelay.protocol`` (which imports it) so the feature's contract reads in
one place. The field carries the W3C Trace Context headers of the caller's span
(``traceparent`` and, when present, ``tracestate``) in the job itself, not in Celery's
message headers: the request is what a takeover's requeued copy carries on, so every run
of the job, first or not, continues the caller's trace. Bounded like every per-request
input: a value past the bounds fails the job as ``invalid_request``, and the SDK never
sends one (``kvrelay.tracing.carrier`` drops what does not fit). The field is left out of
``request_digest``: a retry of the same job from another trace is still the same job.
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta

__all__ = ["MAX_TRACE_FIELDS", "MAX_TRACE_KEY_CHARS", "MAX_TRACE_VALUE_CHARS", "TraceContext"]

# W3C Trace Context defines two headers; room is left for one or two more (baggage).
MAX_TRACE_FIELDS: Final = 4
MAX_TRACE_KEY_CHARS: Final = 64
# ``tracestate`` may hold 32 members; propagators keep at least 512 characters of it.
MAX_TRACE_VALUE_CHARS: Final = 512

TraceContext = Annotated[
    dict[Annotated[str, Meta(max_length=MAX_TRACE_KEY_CHARS)],
         Annotated[str, Meta(max_length=MAX_TRACE_VALUE_CHARS)]],
    Meta(max_length=MAX_TRACE_FIELDS),
]
