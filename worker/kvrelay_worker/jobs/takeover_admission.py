"""Before a delivered copy is claimed: is it a job that ran before, how many tokens would
its resume prefill again, and does this worker's takeover throttle admit it
(``takeover_throttle``)? Only such a copy is re-prefilled, so only it is throttled.

Read, never written: the claim that follows decides everything (a copy of a job that is
owned or done is dropped there); an answer that is stale by then only makes the throttle
count a job it need not, or miss one, once. Where Redis or the prompt cannot be read
here, the copy passes: the claim and the pickup checks judge both, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from kvrelay import event_log
from kvrelay.event_frames import unpack_events
from kvrelay.protocol import GenerateRequest, decode_event
from kvrelay_worker.intake.job_request import JobRejected
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.prior_progress import progress_from_events
from kvrelay_worker.jobs.store_calls import text
from kvrelay_worker.jobs.takeover_throttle import Reservation, TakeoverThrottle

log = logging.getLogger(__name__)

# Record states of a job that no run holds but one may claim: ``queued`` (requeued or
# handed back) and ``running`` (its lease ran out; the requeue is not committed yet).
_CLAIMABLE = frozenset({"queued", "running"})


def resumed_tokens(store: JobStore, job_id: str) -> int | None:
    """The tokens earlier attempts of ``job_id`` put in its log (every choice's), when it
    was claimed before and no lease holds it now; None for a first run, or a job that
    is owned or ended. Events still only in a dead owner's tail are not counted."""
    pipe = store.redis.pipeline(transaction=False)
    pipe.hmget(store.keys.job_record(job_id), "state", "attempts")
    pipe.exists(store.keys.lease(job_id))
    (state, attempts), leased = pipe.execute()
    if leased or state is None or text(state) not in _CLAIMABLE or int(attempts or 0) < 1:
        return None
    entries: Any = store.redis.xrange(store.keys.event_log(job_id))
    events = [decode_event(bytes(raw)) for _, fields in entries
              if (data := event_log.entry_events(fields)) is not None
              for raw in unpack_events(data)]
    return sum(len(tokens) for tokens in progress_from_events(events).tokens.values())


class TakeoverAdmission:
    """One worker's door for delivered copies, in front of its claims."""

    def __init__(self, store: JobStore, throttle: TakeoverThrottle,
                 prompt_tokens: Callable[[GenerateRequest], int]) -> None:
        self.store = store
        self.throttle = throttle
        self.prompt_tokens = prompt_tokens  # raises JobRejected for a prompt it refuses

    def admit(self, job_id: str, request: GenerateRequest) -> Reservation | None:
        """A reservation to hold while the copy is claimed and run (``release`` it after),
        or None: hand the copy back to the queue unclaimed. A copy of a job that never
        ran passes at once, with a reservation of nothing."""
        try:
            generated = resumed_tokens(self.store, job_id)
            tokens = None if generated is None else self.prompt_tokens(request) + generated
        except (redis.RedisError, JobRejected):
            tokens = None
        if tokens is None:
            return Reservation(job_id, 0)
        reservation = self.throttle.admit(job_id, tokens)
        if reservation is None:
            log.warning("handing back the copy of job %s (%d tokens to prefill again): "
                        "this worker holds %d re-prefill tokens of taken-over jobs, budget "
                        "%.0f", job_id, tokens, self.throttle.pending_tokens(),
                        self.throttle.budget_tokens())
        return reservation
