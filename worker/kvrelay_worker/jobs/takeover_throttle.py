"""How much of a dead worker's work one survivor takes on: its takeover claims are
throttled by the re-prefill it already holds.

Why: every live worker's consumer pulls the copies of a dead worker's jobs as fast as it
has free task slots, whatever its engine's speed, so without this the survivors split
them evenly and a slow survivor's share decides the longest pause. Each copy of a job
that ran before (``resumed_copy``) is looked at before its claim: the survivor admits it
while the re-prefill tokens it holds (taken-over jobs admitted, still waiting for or in
their re-prefill: no new token yet), this copy's included, stay within
``KVRELAY_TAKEOVER_TARGET_S`` times its engine's *measured* prefill rate
(``engine/prefill_rate.py``). A survivor over that budget holds the copy for a short
while (its budget frees as its re-prefills end), then hands it back to the queue
unclaimed, so a faster survivor takes it.

Progress is guaranteed: a worker holding no pending re-prefill always admits (a job
larger than any budget still runs somewhere), and a copy is handed back only after
``hold_s``, so throttled workers pass a copy between them at most once per hold, never
in a hot loop. A copy handed back was never claimed: its job's attempts, deadline and
lost-worker count are untouched, and its record stays ``queued``, watched by the
lost-copy watch (``queued_copies``) should the pushed copy be lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvrelay_worker.jobs.active_job import ActiveJob

# How often a held copy looks at the budget again.
_POLL_S = 0.05


def hold_seconds(target_s: float) -> float:
    """How long a throttled worker keeps a copy waiting for its own budget before it
    hands it back: long enough that copies do not spin between throttled workers, short
    enough that a copy it cannot take soon reaches another survivor quickly."""
    return min(1.0, max(0.1, target_s / 4))


@dataclass(eq=False)
class Reservation:
    """One admitted copy's re-prefill tokens, counted until its job has a new token or
    this worker lets go of it (``release``)."""

    job_id: str
    tokens: int
    _owner: TakeoverThrottle | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._owner is not None:
            self._owner.forget(self)
            self._owner = None


class TakeoverThrottle:
    """Admits or refuses the copies of taken-over jobs for one worker (any thread)."""

    def __init__(self, target_s: float, rate: Callable[[], float],
                 held: Callable[[], Iterable[ActiveJob]], *, hold_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.target_s = target_s
        self.rate = rate  # the engine's measured prompt tokens per second (0: unknown)
        self.held = held  # the jobs this worker holds now (``OwnedJobs.jobs``)
        self.hold_s = hold_seconds(target_s) if hold_s is None else hold_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._reserved: dict[Reservation, None] = {}

    def budget_tokens(self) -> float:
        """The re-prefill tokens this worker may hold at once: target x measured rate."""
        return self.target_s * max(0.0, self.rate())

    def pending_tokens(self) -> int:
        """Re-prefill tokens of the admitted copies whose jobs have no new token yet."""
        with self._lock:
            return self._pending()

    def _pending(self) -> int:
        jobs = {job.job_id: job for job in self.held()}
        total = 0
        for reservation in self._reserved:
            job = jobs.get(reservation.job_id)
            if job is None or (job.first_token_at is None and not job.done.is_set()):
                total += reservation.tokens  # claimed soon, or claimed and re-prefilling
        return total

    def try_admit(self, job_id: str, tokens: int) -> Reservation | None:
        """Admit now if this worker holds no pending re-prefill or the copy fits its
        budget; else None."""
        with self._lock:
            pending = self._pending()
            if pending and pending + tokens > self.budget_tokens():
                return None
            reservation = Reservation(job_id, tokens, self)
            self._reserved[reservation] = None
            return reservation

    def admit(self, job_id: str, tokens: int) -> Reservation | None:
        """``try_admit``, tried again until ``hold_s`` has passed; None: hand it back."""
        give_up = self._clock() + self.hold_s
        while True:
            reservation = self.try_admit(job_id, tokens)
            if reservation is not None or self._clock() >= give_up:
                return reservation
            self._sleep(_POLL_S)

    def forget(self, reservation: Reservation) -> None:
        with self._lock:
            self._reserved.pop(reservation, None)
