"""The checker: what every job's caller saw, what the store holds and what went over the
wire, against the reference tokens and the rules (docs/chaos.md).

- A job that was not cancelled completes exactly once: its caller gets a completion
  whose tokens are the reference's; a streaming caller got every token event once, in
  seq order, and nothing else; its log holds seqs 0..end with no gap, one terminal
  event, last, and the reference's tokens.
- A cancelled job stops: its log ends with ``cancelled`` (or ``Finished`` with the whole
  reference, when the cancel came too late), its caller hears the end within a bound,
  and no run of it starts after the cancel was acknowledged.
- No job starts after its queue deadline.
- Nothing is published after a job's terminal event, and no seq carries two different
  events.
- Runs do not overlap: once a later run of a job has written to its log, no entry of an
  earlier run follows (each log entry names the run that wrote it).

Time bounds are widened by the faults that overlap them (a stopped worker cannot stop a
job); what the tap did not see is unknown, never a violation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.faults import FaultRecord
from chaos.reference import Reference
from chaos.schedule import CANCEL, GENERATE, ORPHAN, RACE, RESUME
from chaos.tap import Tapped
from chaos.workload import JobRun
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    AnyEvent,
    ErrorCode,
    Failed,
    Finished,
    Started,
    Tokens,
)
from kvrelay.stream_order import _PICKUP_GRACE_S

# How long past its queue deadline the SDK still waits for a job's first event before
# it raises ``QueueTimeout`` (the SDK's own ``_PICKUP_GRACE_S``).
PICKUP_GRACE_S = _PICKUP_GRACE_S

# Seconds a running job may take to stop once its cancel is acknowledged, with no fault.
STOP_BOUND_S = 3.0
# Seconds a fault's effects outlast it (a lease to expire, a takeover, a restart).
FAULT_SETTLE_S = 5.0
# Slack on a worker's own queue-time measurement (it rounds, clocks tick).
QUEUE_SLACK_S = 0.25


@dataclass(frozen=True)
class Violation:
    job: int | None  # the job's index in the schedule; None for the whole run
    rule: str
    detail: str

    def __str__(self) -> str:
        where = f"job {self.job}" if self.job is not None else "run"
        return f"{where}: {self.rule}: {self.detail}"


# How much sooner than ``KVRELAY_LOG_TTL`` after the job's end a log may be gone for the
# checker (the tap hears the end a moment after it is written).
EXPIRY_SLACK_S = 0.25


def allowance(faults: Sequence[FaultRecord], start: float, end: float) -> float:
    """Extra seconds for a bound on ``[start, end]``: each fault that overlaps it adds
    its own length and the time its effects take to settle."""
    extra = 0.0
    for fault in faults:
        if fault.began <= end and fault.ended + FAULT_SETTLE_S >= start:
            extra += fault.ended - fault.began + FAULT_SETTLE_S
    return extra


def per_choice(events: Sequence[AnyEvent]) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, Tokens):
            tokens.setdefault(event.index, []).extend(event.token_ids)
    return tokens


def _as_lists(reference: list[list[int]]) -> dict[int, list[int]]:
    return dict(enumerate(reference))


class JobCheck:
    """Every rule for one job; ``violations`` holds what failed."""

    def __init__(self, run: JobRun, expected: list[list[int]], log: list[AnyEvent],
                 tapped: list[Tapped], faults: Sequence[FaultRecord],
                 writers: list[str] | None = None, skew_s: float = 0.0,
                 picked: bool = False, log_ttl_s: float | None = None) -> None:
        self.run = run
        self.picked = picked
        self.log_ttl_s = log_ttl_s
        self.expected = _as_lists(expected)
        self.log = log
        # Per logged event, the run that wrote its entry ('' : none named).
        self.writers = writers or []
        # How far a worker's wall clock is off at most: a worker judges queue deadlines
        # and measures its queue time by its own clock (docs/behaviour.md, "Deadlines
        # compare clocks"), so those bounds widen by it; leases do not (Redis's clock).
        self.skew_s = skew_s
        self.tapped = tapped
        self.faults = faults
        self.violations: list[Violation] = []

    def fail(self, rule: str, detail: str) -> None:
        self.violations.append(Violation(self.run.plan.index, rule, detail))

    def check(self) -> list[Violation]:
        self._log_shape()
        self._run_fence()
        self._wire()
        self._client_order()
        self._queue_deadline()
        cancelled = self.run.plan.behaviour in (CANCEL, RACE) and \
            self.run.cancel_acked_at is not None
        if cancelled:
            self._cancelled()
        elif self.run.plan.behaviour == ORPHAN:
            self._orphaned()
        elif self.run.plan.queue_timeout is not None and self.run.outcome == "QueueTimeout":
            self._expired_in_queue()
        else:
            self._completed()
        return self.violations

    # ---------------------------------------------------------------- the store

    @property
    def terminal(self) -> AnyEvent | None:
        return self.log[-1] if self.log and isinstance(self.log[-1], TERMINAL_EVENTS) else None

    def _log_shape(self) -> None:
        seqs = [e.seq for e in self.log]
        if seqs != list(range(len(seqs))):
            missing = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
            self.fail("log-seq", f"log seqs not 0..n: missing {missing[:10]}, "
                      f"{len(seqs)} events, last {seqs[-1:] }")
        ends = [e.seq for e in self.log if isinstance(e, TERMINAL_EVENTS)]
        if len(ends) > 1 or (ends and ends[-1] != seqs[-1]):
            self.fail("log-terminal", f"terminal events at seqs {ends} of {len(seqs)}")
        for index, tokens in per_choice(self.log).items():
            want = self.expected.get(index, [])
            if tokens != want[:len(tokens)]:
                at = next((i for i, (a, b) in enumerate(zip(tokens, want, strict=False))
                           if a != b), min(len(tokens), len(want)))
                self.fail("log-tokens", f"choice {index} differs from the reference at "
                          f"token {at} ({len(tokens)} logged, {len(want)} expected)")

    def _run_fence(self) -> None:
        """One run at a time: once a later run has an entry in the log, no entry of an
        earlier run follows (a fenced run kept writing); a run's ``Started`` is in an
        entry it wrote; runs start in the order of their attempts. On the wire, a
        ``Started`` names its run: the log's event at that seq is that run's."""
        order: list[str] = []
        by_seq: dict[int, str] = {}
        for event, writer in zip(self.log, self.writers, strict=False):
            by_seq[event.seq] = writer
            if isinstance(event, Started) and event.run and writer and writer != event.run:
                self.fail("run-fence", f"the Started of run {event.run} (seq {event.seq}) is "
                          f"in an entry written by {writer}")
            if not writer or (order and order[-1] == writer):
                continue
            if writer in order:
                self.fail("run-fence", f"run {writer} wrote seq {event.seq} after run "
                          f"{order[-1]} had written: two runs wrote after a fence")
                break
            order.append(writer)
        attempts = [e.attempt for e in self.log if isinstance(e, Started)]
        if any(b <= a for a, b in itertools.pairwise(attempts)):
            self.fail("run-fence", f"runs started in the log as attempts {attempts}")
        if not self.writers:
            return
        for tapped in self.tapped:
            event = tapped.event
            if isinstance(event, Started) and event.run:
                writer = by_seq.get(event.seq)
                if writer and writer != event.run:
                    self.fail("run-fence", f"run {event.run} published its Started as seq "
                              f"{event.seq}; the log's seq {event.seq} is run {writer}'s")

    # ---------------------------------------------------------------- the wire

    def _wire(self) -> None:
        by_seq: dict[int, Tapped] = {}
        conflicts: dict[int, tuple[Tapped, Tapped]] = {}
        for tapped in self.tapped:
            seen = by_seq.setdefault(tapped.event.seq, tapped)
            if seen.raw != tapped.raw:
                conflicts.setdefault(tapped.event.seq, (seen, tapped))
        if conflicts:
            first = min(conflicts)
            a, b = conflicts[first]
            self.fail("wire-conflict", f"two different events published under seqs "
                      f"{sorted(conflicts)[:10]} (seq {first}: {_described(a)}, then "
                      f"{_described(b)} {b.at - a.at:.2f}s later)")
        self._no_run_after_end()
        end = self.terminal
        if end is not None:
            late = sorted({t.event.seq for t in self.tapped if t.event.seq > end.seq})
            if late:
                self.fail("after-terminal", f"published seqs {late[:10]} after the terminal "
                          f"event {end.seq}")

    def _no_run_after_end(self) -> None:
        """Once the job's terminal event went over the wire, no new run of it starts (a
        batch sent again republishes its own ``Started``, which is no new run)."""
        ended = [t.at for t in self.tapped if isinstance(t.event, TERMINAL_EVENTS)]
        if not ended:
            return
        before = {t.raw for t in self.tapped
                  if isinstance(t.event, Started) and t.at <= min(ended)}
        for tapped in self.tapped:
            event = tapped.event
            if isinstance(event, Started) and tapped.at > min(ended) and \
                    tapped.raw not in before:
                self.fail("run-after-end", f"run {event.run or event.worker} (attempt "
                          f"{event.attempt}) started {tapped.at - min(ended):.1f}s after "
                          f"the job's end was published: the job ran again")
                return

    # ---------------------------------------------------------------- the caller

    def _client_order(self) -> None:
        seqs = [c.seq for c in self.run.chunks]
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            self.fail("client-order", f"chunk seqs not strictly increasing: {seqs[:40]}")
        logged = {e.seq: e for e in self.log if isinstance(e, Tokens)}
        for chunk in self.run.chunks:
            event = logged.get(chunk.seq)
            if event is None:
                # Every event a caller is shown is in the job's log (its worker writes
                # the log before a job ends): a chunk the log lacks was lost from it.
                self.fail("client-vs-log", f"chunk seq {chunk.seq} is not in the log "
                          f"({len(self.log)} events)")
                break
            if list(chunk.token_ids) != event.token_ids or chunk.index != event.index:
                self.fail("client-vs-log", f"chunk seq {chunk.seq} is not the logged event")
                break

    def _completed(self) -> None:
        run = self.run
        if run.outcome != "completed":
            if not self._resumed_after_the_log_expired():
                self.fail("incomplete", f"{run.outcome}: {run.error}"[:300])
            return
        assert run.completion is not None
        got = _as_lists(run.completion)
        if got != self.expected:
            self.fail("tokens", _first_difference(got, self.expected))
        if any(reason != "length" for reason in run.finish_reasons):
            self.fail("finish-reason", f"{run.finish_reasons}")
        if not isinstance(self.terminal, Finished):
            self.fail("log-terminal", f"completed, but the log ends with {self.terminal!r}"[:200])
        if run.plan.behaviour != GENERATE:
            logged = [e.seq for e in self.log if isinstance(e, Tokens)]
            seen = [c.seq for c in run.chunks]
            if seen != logged:
                self.fail("exactly-once", f"the caller saw token seqs {_diff(seen, logged)}")
            shown: dict[int, list[int]] = {}
            for chunk in run.chunks:
                shown.setdefault(chunk.index, []).extend(chunk.token_ids)
            if shown != self.expected:
                self.fail("streamed-tokens", _first_difference(shown, self.expected))

    def _orphaned(self) -> None:
        """A caller killed mid-stream: its job still runs to its end, whole."""
        run = self.run
        if run.outcome not in ("killed", "completed"):
            self.fail("orphan", f"the caller never streamed: {run.outcome}: {run.error}"[:300])
        if not isinstance(self.terminal, Finished):
            self.fail("orphan", f"its caller died; the log ends with {self.terminal!r}"[:200])
        elif per_choice(self.log) != self.expected:
            self.fail("orphan", _first_difference(per_choice(self.log), self.expected))

    def _cancelled(self) -> None:
        run = self.run
        assert run.cancel_acked_at is not None
        end = self.terminal
        if isinstance(end, Finished):
            if per_choice(self.log) != self.expected:
                self.fail("cancel", "finished after its cancel with other tokens")
        elif not (isinstance(end, Failed) and end.code == "cancelled"):
            self.fail("cancel", f"log ends with {end!r} after an acknowledged cancel"[:200])
        if run.outcome not in ("Cancelled", "completed"):
            self.fail("cancel", f"caller got {run.outcome}: {run.error}"[:300])
        ended = run.ended_at or 0.0
        bound = STOP_BOUND_S + allowance(self.faults, run.cancel_acked_at, ended)
        if ended - run.cancel_acked_at > bound:
            self.fail("cancel-stop", f"ended {ended - run.cancel_acked_at:.1f}s after the "
                      f"cancel (bound {bound:.1f}s)")
        if isinstance(end, Finished):
            # A cancel that came too late is lawful only if the job was finishing
            # anyway: its ``Finished`` was published within the stop bound of the
            # cancel reaching Redis (the abort flag is written before ``cancel()``
            # returns). One much later means the cancel was lost and the job ran on.
            done = [t.at for t in self.tapped if isinstance(t.event, TERMINAL_EVENTS)]
            at = min(done) if done else ended
            late = STOP_BOUND_S + allowance(self.faults, run.cancel_acked_at, at)
            if at - run.cancel_acked_at > late:
                self.fail("cancel-finished", f"finished {at - run.cancel_acked_at:.1f}s after "
                          f"its cancel reached Redis (bound {late:.1f}s): the cancel was lost")
        for tapped in self.tapped:
            if isinstance(tapped.event, Started) and tapped.at > run.cancel_acked_at + bound:
                self.fail("run-after-cancel", f"a run started {tapped.at - run.cancel_acked_at:.1f}s "
                          f"after the cancel (attempt {tapped.event.attempt})")

    def _expired_in_queue(self) -> None:
        """``QueueTimeout`` is lawful only when the evidence shows the job was not
        started before its queue deadline plus the SDK's pickup grace, and that it
        ended: a worker dropped it (``Failed(queue_timeout)``) or the caller's abort
        ended it (``Failed(cancelled)``). A job whose log never ended was never
        received (a lost enqueue or a lost delivery) or is running unheard."""
        run = self.run
        end = self.terminal
        if isinstance(end, Finished):
            self.fail("queue-timeout", "the caller got QueueTimeout, yet the job finished")
            return
        if run.queue_deadline is not None:
            gave_up = run.queue_deadline + PICKUP_GRACE_S
            early = [t.at for t in self.tapped if isinstance(t.event, Started)
                     and t.at <= gave_up - QUEUE_SLACK_S - self.skew_s]
            if early:
                self.fail("queue-timeout", f"the caller got QueueTimeout, yet a run started "
                          f"{early[0] - run.queue_deadline:+.2f}s from its queue deadline "
                          f"(the SDK waits {PICKUP_GRACE_S:g}s past it)")
        if end is None:
            started = any(isinstance(e, Started) for e in self.log)
            self.fail("queue-timeout", "the caller got QueueTimeout and the job never ended "
                      + ("(a run started and wrote no terminal event)" if started else
                         "(its log is empty: no worker ever received it, a lost enqueue or "
                         "delivery)"))
        elif not (isinstance(end, Failed) and end.code in (ErrorCode.QUEUE_TIMEOUT,
                                                          ErrorCode.CANCELLED)):
            self.fail("queue-timeout", f"the caller got QueueTimeout, the log ends with "
                      f"{end!r}"[:200])

    def _resumed_after_the_log_expired(self) -> bool:
        """A resume that reached Redis only once the job's log had expired (refused or
        paused writes held its watch back past ``KVRELAY_LOG_TTL`` after the job's end,
        as the tap heard it) is answered ``UnknownJob``: the retention rule, not a loss."""
        run = self.run
        if (self.log_ttl_s is None or run.plan.behaviour != RESUME
                or run.outcome != "UnknownJob" or run.ended_at is None):
            return False
        ends = [t.at for t in self.tapped if isinstance(t.event, TERMINAL_EVENTS)]
        return bool(ends) and run.ended_at - min(ends) >= self.log_ttl_s - EXPIRY_SLACK_S

    def _queue_deadline(self) -> None:
        """The first pickup came before the queue deadline: the worker's own
        ``timings.queue`` says so for a job never taken over (after a takeover it
        measures the last claim); else the time its first ``Started`` was published
        bounds it. A job whose record says a worker took it in time (its message given
        back, or pushed again after it was lost on its way) may start later: it is not
        refused for the wait a fault added."""
        run = self.run
        if self.picked:
            return
        started = [e for e in self.log if isinstance(e, Started)]
        if not started or run.queue_deadline is None or run.enqueued_at is None:
            return
        end = self.terminal
        taken_over = any(e.attempt > 1 for e in started) or any(
            isinstance(t.event, Started) and t.event.attempt > 1 for t in self.tapped)
        if not taken_over and isinstance(end, Finished) and end.timings.queue > 0:
            waited = end.timings.queue
            if waited > run.queue_deadline - run.enqueued_at + QUEUE_SLACK_S + self.skew_s:
                self.fail("queue-deadline", f"picked up after {waited:.2f}s, its queue limit "
                          f"{run.queue_deadline - run.enqueued_at:.2f}s")
            return
        first = [t.at for t in self.tapped if isinstance(t.event, Started)]
        if first:
            bound = run.queue_deadline + allowance(self.faults, run.enqueued_at, first[0])
            if first[0] > bound + STOP_BOUND_S + self.skew_s:
                self.fail("queue-deadline", f"started {first[0] - run.queue_deadline:.2f}s "
                          f"past its queue deadline")


def _diff(seen: list[int], logged: list[int]) -> str:
    dup = sorted({s for s in seen if seen.count(s) > 1})
    missing = sorted(set(logged) - set(seen))
    extra = sorted(set(seen) - set(logged))
    return f"duplicated {dup[:10]}, missing {missing[:10]}, not logged {extra[:10]}"


def _first_difference(got: dict[int, list[int]], want: dict[int, list[int]]) -> str:
    for index in sorted(set(got) | set(want)):
        a, b = got.get(index, []), want.get(index, [])
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
            return f"choice {index}: {len(a)} tokens for {len(b)}, first difference at {at}"
    return "equal"


def check_jobs(runs: Sequence[JobRun], reference: Reference, logs: dict[str, list[AnyEvent]],
               tapped: dict[str, list[Tapped]], faults: Sequence[FaultRecord],
               writers: dict[str, list[str]] | None = None, *, skew_s: float = 0.0,
               picked: set[str] | None = None, log_ttl_s: float | None = None
               ) -> list[Violation]:
    """Every rule for every job; ``writers`` holds, per job, the run that wrote each
    logged event (``chaos.log_read``); ``skew_s``: how far a worker's clock is off;
    ``picked``: the jobs whose record says a worker took them in time; ``log_ttl_s``:
    how long an ended job's log lives (None: a resume must always find it)."""
    found: list[Violation] = []
    for run in runs:
        found += JobCheck(run, reference[run.plan.index], logs.get(run.job_id, []),
                          tapped.get(run.job_id, []), faults,
                          (writers or {}).get(run.job_id), skew_s,
                          run.job_id in (picked or set()), log_ttl_s).check()
    return found


def _described(tapped: Tapped) -> str:
    """A tapped event in a few words: its type and what tells two runs apart."""
    event = tapped.event
    parts = [type(event).__name__]
    for name in ("run", "attempt", "index", "token_ids"):
        value = getattr(event, name, None)
        if value not in (None, "", []):
            parts.append(f"{name}={value if name != 'token_ids' else list(value)[:4]}")
    return " ".join(parts)
