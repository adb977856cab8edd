"""The caller's spans of one job: the call, its admission, and the delivery of its stream.

``begin_job_trace`` returns None while tracing is off, and the stream then does nothing
more than check that. Otherwise a ``JobTrace`` holds three spans::

    chat <model> / text_completion <model>   (CLIENT: from the call's start to its end)
      kvrelay.admission   (PRODUCER: prechecks, reservation, the push onto the queue)
      kvrelay.delivery    (from the job on its queue until its terminal event, or until
                           the caller leaves)

The request carries the W3C trace context of the first span (``carrier.inject``): every
span the job's workers record, on any attempt, is in the same trace, under it. The
stream tells the trace only of its rare events (the job admitted, ``Started``, the
terminal event, the end): nothing is done per token. Tracing never fails a job: an
error here is logged and the trace dropped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kvrelay.protocol import Finished, GenerateRequest, Started
from kvrelay.tracing import attributes as attr
from kvrelay.tracing.carrier import inject
from kvrelay.tracing.switch import active_tracer

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["JobTrace", "begin_job_trace"]

log = logging.getLogger("kvrelay.tracing")


def begin_job_trace(request: GenerateRequest) -> JobTrace | None:
    """The spans of a new job whose call starts now; None while tracing is off."""
    tracer = active_tracer()
    if tracer is None:
        return None
    try:
        return JobTrace(tracer, request)
    except Exception as exc:
        log.warning("could not start the spans of job %s: %s", request.job_id, exc)
        return None


class JobTrace:
    """The open spans of one job on the caller's side (see the module's docstring)."""

    __slots__ = ("_admission", "_delivery", "_model", "_root", "_trace", "_tracer")

    def __init__(self, tracer: Tracer, request: GenerateRequest) -> None:
        from opentelemetry import trace

        self._trace: Any = trace
        self._tracer = tracer
        self._model = request.model
        self._root: Span = tracer.start_span(attr.span_name(request), kind=trace.SpanKind.CLIENT,
                                             attributes=attr.request_attributes(request))
        self._admission: Span | None = self._child("kvrelay.admission", trace.SpanKind.PRODUCER)
        self._delivery: Span | None = None

    def _child(self, name: str, kind: Any = None) -> Span:
        context = self._trace.set_span_in_context(self._root)
        if kind is None:
            kind = self._trace.SpanKind.INTERNAL
        span: Span = self._tracer.start_span(name, context=context, kind=kind)
        return span

    def carrier(self) -> dict[str, str] | None:
        """The job's ``trace_context``: the W3C headers of the call's span."""
        try:
            return inject(self._root)
        except Exception as exc:
            log.warning("could not write the job's trace context: %s", exc)
            return None

    def admitted(self) -> None:
        """The job is on its queue (or an earlier send of it was found): delivery starts."""
        if self._admission is not None:
            self._admission.end()
            self._admission = None
        if self._delivery is None:
            self._delivery = self._child("kvrelay.delivery")

    def started(self, event: Started) -> None:
        """A worker took the job: a takeover when its attempt is not the first."""
        self._root.set_attributes({attr.WORKER: event.worker, attr.ATTEMPT: event.attempt})
        self._root.add_event("kvrelay.started", {attr.WORKER: event.worker,
                                                 attr.ATTEMPT: event.attempt})
        if event.attempt > 1:
            self._root.set_attribute(attr.TAKEOVER, True)

    def finished(self, event: Finished) -> None:
        self._root.set_attributes(attr.usage_attributes(event, self._model))

    def end(self, error: BaseException | None, closed: bool) -> None:
        """End every open span: with ``error`` as the call's status, or as left early."""
        try:
            outcome = "closed" if closed and error is None else (
                "failed" if error is not None else "finished")
            self._root.set_attribute(attr.OUTCOME, outcome)
            if error is not None:
                code = getattr(error, "code", None) or type(error).__name__
                status = self._trace.Status(self._trace.StatusCode.ERROR, str(error))
                self._root.set_attribute(attr.ERROR_TYPE, str(code))
                self._root.set_status(status)
                if self._admission is not None:  # refused before it was on a queue
                    self._admission.set_status(status)
            for span in (self._admission, self._delivery):
                if span is not None:
                    span.end()
            self._admission = self._delivery = None
            self._root.end()
        except Exception as exc:
            log.warning("could not end the spans of a job: %s", exc)
