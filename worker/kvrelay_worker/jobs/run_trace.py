"""The spans of one run of a job on this worker, made by its task thread once it is over.

The engine thread does no tracing work: a run's spans are made from the timestamps the
worker keeps anyway (``ActiveJob``: picked, claimed, first and last token written, ended)
with explicit start and end times, after the run ended. They join the caller's trace
through the request's ``trace_context`` (a takeover's requeued copy carries it too)::

    kvrelay.queue_wait     enqueued (caller's clock) -> picked    first attempt only
    kvrelay.run            picked -> ended  (CONSUMER; kvrelay.attempt, kvrelay.takeover)
      kvrelay.claim        picked -> claimed   (lease, the log's replay, the prompt's tokens)
      kvrelay.takeover     picked -> first new token   (attempt > 1: resuming from the log)
      kvrelay.prefill      claimed -> first token written
      kvrelay.decode       first -> last token written
      kvrelay.publish      first token (or claim) -> terminal event stored

A run that dies with its worker records nothing; the run that takes the job over is
marked ``kvrelay.takeover`` in the same trace. Tracing never fails a job: an error here
is logged.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kvrelay.protocol import Failed
from kvrelay.tracing import attributes as attr
from kvrelay.tracing.carrier import parent_context
from kvrelay.tracing.switch import active_tracer
from kvrelay_worker.jobs.active_job import ActiveJob

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Tracer

__all__ = ["record_run"]

log = logging.getLogger(__name__)


def record_run(job: ActiveJob, worker: str) -> None:
    """Record the spans of ``job``'s run on this worker (``worker``: its ``host:pid``)."""
    tracer = active_tracer()
    if tracer is None:
        return
    try:
        _record(tracer, job, worker)
    except Exception as exc:
        log.warning("could not record the spans of job %s: %s", job.job_id, exc)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _span(tracer: Tracer, name: str, context: Context, start: float, end: float,
          attributes: attr.Attributes | None = None) -> None:
    span = tracer.start_span(name, context=context, start_time=_ns(start),
                             attributes=attributes)
    span.end(end_time=_ns(max(start, end)))


def _record(tracer: Tracer, job: ActiveJob, worker: str) -> None:
    from opentelemetry import trace

    request = job.request
    parent = parent_context(request.trace_context)
    picked = job.picked_at or job.claimed_at
    claimed = max(job.claimed_at, picked)
    ended = max(job.ended_at or time.time(), claimed)
    first, last = job.first_token_at, job.last_token_at
    takeover = job.attempt > 1
    if not takeover and request.enqueued_at:
        # The caller's clock starts it: never after the pickup, whatever the clocks say.
        _span(tracer, "kvrelay.queue_wait", parent, min(request.enqueued_at, picked), picked,
              {attr.JOB_ID: job.job_id})
    attributes: attr.Attributes = {
        **attr.request_attributes(request),
        attr.INPUT_TOKENS: len(job.prompt_ids),
        attr.WORKER: worker,
        attr.ATTEMPT: job.attempt,
        attr.TAKEOVER: takeover,
        attr.OUTCOME: job.outcome or "unknown",
        **attr.usage_attributes(job.terminal, request.model),
    }
    run = tracer.start_span("kvrelay.run", context=parent, kind=trace.SpanKind.CONSUMER,
                            start_time=_ns(picked), attributes=attributes)
    if isinstance(job.terminal, Failed):
        run.set_status(trace.Status(trace.StatusCode.ERROR,
                                    f"{job.terminal.code}: {job.terminal.message}"))
    inside = trace.set_span_in_context(run, parent)
    _span(tracer, "kvrelay.claim", inside, picked, claimed)
    if takeover:
        prior = job.prior
        _span(tracer, "kvrelay.takeover", inside, picked, first or ended, {
            attr.ATTEMPT: job.attempt,
            attr.RESUMED_AT_SEQ: prior.next_seq,
            attr.PRIOR_TOKENS: sum(len(tokens) for tokens in prior.tokens.values()),
        })
    if first is not None:
        _span(tracer, "kvrelay.prefill", inside, claimed, first)
        _span(tracer, "kvrelay.decode", inside, first, last or first)
    published: attr.Attributes = {}
    if job.terminal is not None:
        published[attr.EVENTS] = job.terminal.seq - job.prior.next_seq + 1
    _span(tracer, "kvrelay.publish", inside, first or claimed, ended, published)
    run.end(end_time=_ns(ended))
