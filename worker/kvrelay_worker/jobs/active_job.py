"""One claimed job as the worker's threads share it: task thread, engine, publisher."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from kvrelay.protocol import AnyEvent, GenerateRequest
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.log_window import LogWindow
from kvrelay_worker.jobs.prior_replay import ReplayPlan


class Outcome:
    """How a job left this worker."""

    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    HANDBACK = "handback"
    FENCED = "fenced"


# Outcomes after which the job is over for good (its lease released and its record
# marked done); the others (handback, fenced) leave the job to another worker.
ENDED_HERE = frozenset({Outcome.FINISHED, Outcome.FAILED, Outcome.CANCELLED, Outcome.DEADLINE})


@dataclass(eq=False)
class ActiveJob:
    job_id: str
    request: GenerateRequest
    payload_json: str
    params: SamplingParams
    prompt_ids: list[int]
    attempt: int
    prior: PriorProgress
    # The claim's run id (``job_store.run_id``): what the job's lease holds while this
    # run owns it; every write of the run is fenced by it.
    run_id: str = ""
    claimed_at: float = field(default_factory=time.time)
    # When the task thread got the job's message (before its claim): for its spans.
    picked_at: float = 0.0
    # The prefix-cache salt the engine uses: the request's own, kept apart per namespace.
    cache_salt: str | None = None
    # Owned by the publisher thread: the seq the next event gets, the log's byte
    # window (made on the first event, from ``prior``), and when (monotonic clock) the
    # log's expiry is next refreshed (None: at the next batch).
    next_seq: int = 0
    log_window: LogWindow | None = None
    log_expiry_refresh_at: float | None = None
    # Also the publisher's: the job's events written to this worker's tail but not yet
    # to its log (encoded), the seq of the last, and the publisher's tail entry count
    # when the first of them was written (None: none waiting).
    unlogged: list[bytes] = field(default_factory=list)
    unlogged_last: int = -1
    unlogged_since: int | None = None
    # Set by the engine thread when it stops the job early (Outcome.*).
    abort_reason: str | None = None
    # Set by the publisher when the batch that wrote the job's terminal event also
    # released it (``JobEvents.release``): nothing is left to release.
    released: bool = False
    # Set by the publisher when a batch found the job another's (``AppendResult.FENCED``):
    # none of this run's later events is sent (the refused ones are gone, so a later
    # one written would leave a gap in the log).
    fenced: bool = False
    # When (monotonic clock) the job last moved: claimed, held by an engine loop that
    # went round (running, queued in the engine or preempted), or its events sent to
    # Redis. The lease keeper keeps the lease of a job that moved recently, no other.
    progress_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_token_at: float | None = None
    outcome: str | None = None
    # When the run ended here, and the terminal event it wrote (None: it wrote none):
    # what its spans are made from once it is over (``run_trace``).
    ended_at: float | None = None
    terminal: AnyEvent | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _replay: ReplayPlan | None = field(default=None, init=False, repr=False)

    @property
    def deadline(self) -> float | None:
        return self.request.deadline

    @property
    def enqueued_at(self) -> float:
        return self.request.enqueued_at or self.claimed_at

    @property
    def replay(self) -> ReplayPlan:
        """What earlier attempts left: the engine's prior outputs, choices not to resend."""
        if self._replay is None:
            self._replay = ReplayPlan.of(self.params, self.prior)
        return self._replay

    def finish(self, outcome: str, terminal: AnyEvent | None = None) -> None:
        self.outcome = outcome
        self.terminal = terminal
        self.ended_at = time.time()
        self.done.set()
