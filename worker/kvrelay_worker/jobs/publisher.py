"""The publisher thread: every event leaves the worker here, one script call per batch.

The engine thread hands over a batch per step and never waits. While one batch is in
flight, later steps' batches queue up; the next round takes them all at once and merges
each job's token events per choice (``coalesce``), so a publisher that falls behind
sends fewer, larger events instead of a growing backlog. When nothing is in flight a
step's events leave at once. This thread numbers each job's events (``seq``) and sends
the whole batch as one script call (``APPEND_BATCH``): one lease check for all jobs, one
tail entry holding every job's events, one PUBLISH per client (its jobs' events packed
together, ``kvrelay.event_frames``) and one per watched job. A job's events move from the
tail into its own log every ``LOG_MOVE_BATCHES`` batches, when it ends and when this
worker lets go of it, as one log entry, so per token Redis runs a fraction of a command.
A job that ends here is released (record done, lease dropped) by the batch that writes
its terminal event; then the job's task thread is woken.

Nothing is taken for written before Redis says so: a batch Redis refuses (any error
reply) or cannot be reached for is held, in order, and sent again with backoff until it
is written; the batches queued behind it merge into the next round meanwhile. A job's
events move into its log before the tail can drop them, whether or not the job has sent
anything since (a preempted or slow job is quiet for many batches).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from kvrelay.event_log import TAIL_READ_ENTRIES, AppendResult
from kvrelay.protocol import TERMINAL_EVENTS, Tokens, encode_event
from kvrelay_worker.jobs.active_job import ENDED_HERE, ActiveJob, Outcome
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import TAIL_MAX_LEN, JobEvents, JobStore
from kvrelay_worker.jobs.log_window import LogWindow
from kvrelay_worker.jobs.publish_items import DoneItem, EventItem, HandbackItem, Item, coalesce
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.redis_health import RedisHealth

__all__ = ["DoneItem", "EventItem", "HandbackItem", "Item", "Publisher", "coalesce"]

log = logging.getLogger(__name__)


_STOP = object()
# A job's events stay only in this worker's tail for at most this many batches before
# they move into the job's log (the tail keeps ``TAIL_MAX_LEN`` batches: room to spare).
LOG_MOVE_BATCHES = 16
assert LOG_MOVE_BATCHES * 2 <= TAIL_READ_ENTRIES <= TAIL_MAX_LEN


class Publisher:
    def __init__(self, store: JobStore, metrics: WorkerMetrics,
                 requeue: Callable[[str, str], None],
                 on_fenced: Callable[[ActiveJob], None],
                 health: RedisHealth | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.requeue = requeue
        self.on_fenced = on_fenced
        self.health = health or RedisHealth()
        # Jobs with events only in the tail so far, in the order they got them.
        self._unlogged: dict[ActiveJob, None] = {}
        self._queue: queue.SimpleQueue[list[Item] | object] = queue.SimpleQueue()
        # Entries written to this worker's tail so far (retries counted: an upper bound).
        self._tail_entries = 0
        # The tail's expiry as last written is a running job's (longer than an ended
        # job's log lives): shortened once the tail holds no running job's events.
        self._tail_long = False
        # Since when (monotonic) a round is in hand (None: waiting for one), and when this
        # thread last went round or tried a write: a round that stops trying is stuck.
        self._busy_since: float | None = None
        self._beat_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="kvrelay-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def put(self, items: list[Item]) -> None:
        if items:
            self._queue.put(items)

    def is_alive(self) -> bool:
        """Whether the thread runs (a dead one writes no event again: ``vital_threads``)."""
        return self._thread.is_alive()

    def stuck_for(self, now: float) -> float:
        """How long (monotonic seconds, at ``now``) a round has been in hand without
        trying a write: 0 while idle or trying (a write Redis refuses is tried again and
        again: the jobs wait on Redis, they are not stuck here); forever once the thread
        is gone."""
        if not self._thread.is_alive():
            return float("inf")
        if self._busy_since is None:
            return 0.0
        return max(0.0, now - self._beat_at)

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            batches = [first]
            while True:
                try:
                    batches.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items: list[Item] = []
            for batch in batches:
                if batch is _STOP:
                    stopping = True
                else:
                    items.extend(batch)  # type: ignore[arg-type]
            if items:
                self._busy_since = self._beat_at = time.monotonic()
                self._process(coalesce(items))
                self._busy_since = None

    def _process(self, items: list[Item]) -> None:
        events = [i for i in items if isinstance(i, EventItem) and not self._after_fence(i)]
        per_job = self._batch(events)
        tail_before = self._tail_entries
        results = self._send(per_job)
        now = time.time()
        for (job, (job_items, job_events)), result in zip(per_job.items(), results,
                                                         strict=True):
            self._track_unlogged(job, job_events, result, tail_before)
            if job_events.release and result == 1:
                job.released = True  # before the job's end wakes its task thread
            for item in job_items:
                self._after_write(item, result, now)
        for other in items:
            if isinstance(other, HandbackItem):
                self._hand_back(other.job)
            elif isinstance(other, DoneItem):
                self._move_unlogged(other.job)
                other.job.finish(other.outcome)
        if self._tail_long and not self._unlogged:
            self._shorten_tail()

    def _shorten_tail(self) -> None:
        """The tail holds no running job's events any more, but the last batch gave it a
        running job's expiry (its jobs were fenced, or ended without a batch of their
        own): an ended job's log's expiry now, as the retention rule says."""
        until_written(lambda: self.store.shorten_tail(self.store.ended_ttl_s),
                      "the tail's expiry", self.health)
        self._tail_long = False

    @staticmethod
    def _after_fence(item: EventItem) -> bool:
        """An event of a run that a batch found fenced: never sent (its job ends
        ``FENCED`` with its end)."""
        if not item.job.fenced:
            return False
        if item.outcome is not None:
            item.job.finish(Outcome.FENCED)
        return True

    def _batch(self, events: list[EventItem]) -> dict[ActiveJob, tuple[list[EventItem],
                                                                        JobEvents]]:
        """Number and encode the events, grouped per job (each job's order kept), with
        where each job's events are published and what moves into its log this batch."""
        settings = self.store.settings
        per_job: dict[ActiveJob, tuple[list[EventItem], JobEvents]] = {}
        now = time.monotonic()
        for item in events:
            job = item.job
            entry = per_job.get(job)
            if entry is None:
                entry = per_job[job] = ([], JobEvents(job.job_id, job.request.reply_to or "",
                                                      run=job.run_id))
            item.event.seq = job.next_seq
            job.next_seq += 1
            terminal = isinstance(item.event, TERMINAL_EVENTS)
            entry[0].append(item)
            entry[1].events.append((item.event.seq, terminal, encode_event(item.event)))
            if terminal and item.outcome in ENDED_HERE:
                entry[1].release = True
        for job in self._unlogged:
            if job not in per_job and self._move_due(job):
                # Quiet now, but its oldest tail events would soon be trimmed.
                per_job[job] = ([], JobEvents(job.job_id, run=job.run_id))
        for job, (_, job_events) in per_job.items():
            if not (job_events.terminal or self._move_due(job)):
                continue
            if job.log_window is None:
                job.log_window = LogWindow(settings.log_max_bytes, job.prior.entry_sizes)
            job_events.moved = [*job.unlogged, *(data for _, _, data in job_events.events)]
            job_events.moved_last = (job_events.events[-1][0] if job_events.events
                                     else job.unlogged_last)
            job_events.keep_from = job.log_window.add(
                job_events.moved_last, sum(len(data) for data in job_events.moved))
            job_events.expiry_s = self._expiry_due(job, job_events.terminal, now)
        return per_job

    def _move_due(self, job: ActiveJob) -> bool:
        """Whether the job's oldest tail-only events are ``LOG_MOVE_BATCHES`` entries old."""
        return job.unlogged_since is not None and (
            self._tail_entries - job.unlogged_since >= LOG_MOVE_BATCHES - 1)

    def _expiry_due(self, job: ActiveJob, terminal: bool, now: float) -> int:
        """The expiry a move into the job's log sets (0: none due).

        A running job's log is given ``live_ttl + refresh`` seconds and refreshed once
        ``refresh`` (an eighth of ``live_ttl``) has passed, so it always outlives its
        latest event by ``live_ttl`` while costing one EXPIRE per job now and then, not
        one per move. A terminal event sets the ended log's expiry.
        """
        if terminal:
            return self.store.ended_ttl_s
        if job.log_expiry_refresh_at is not None and now < job.log_expiry_refresh_at:
            return 0
        live = self.store.live_ttl_s
        refresh = max(1, live // 8)
        job.log_expiry_refresh_at = now + refresh
        return live + refresh

    def _tail_expiry(self, holds_running: bool) -> int:
        """The expiry the tail should have (the batch's script sets it again once an eighth
        of it has passed, or at once when it differs). While the tail holds events of
        running jobs that are in no log yet, a running job's log's
        (``KVRELAY_LOG_LIVE_TTL``, and the eighth): the tail must outlive them until
        their next owner claims them. Otherwise an ended job's log's
        (``KVRELAY_LOG_TTL``): the tail then only holds events already in their logs."""
        ended, live = self.store.ended_ttl_s, self.store.live_ttl_s
        return max(ended, live + max(1, live // 8)) if holds_running else ended

    def _send(self, per_job: dict[ActiveJob, tuple[list[EventItem], JobEvents]]
              ) -> list[object]:
        """One script call for the whole batch, sent until it is written: while Redis is
        unreachable or answers any error (refusing writes, out of memory, failing over),
        the batch is held and tried again. An event is never taken for written, nor its
        job for finished, before it is. (A retry may write the tail and publish again:
        readers drop seqs they have; a log entry is never written twice.)"""
        batch = [job_events for _, job_events in per_job.values()]
        entries = 1 if any(b.events for b in batch) else 0  # one tail entry per batch
        # Tail-only events of running jobs once this batch is written (its moves taken).
        holds_running = any(b.events and not b.moved for b in batch) or any(
            job not in per_job or not per_job[job][1].moved for job in self._unlogged)
        tail_expiry = self._tail_expiry(holds_running)

        def attempt() -> list[object]:
            # Each try marks the batch's jobs as moving, refused or not: a job whose
            # events wait on Redis keeps its lease, as it did before (an outage is not a
            # death); one whose events stop being tried does not.
            self._beat_at = now = time.monotonic()
            for job in per_job:
                job.progress_at = now
            self._tail_entries += entries
            results = self.store.append_batch(batch, tail_expiry_s=tail_expiry)
            for result in results:
                if isinstance(result, Exception):
                    raise result
            return results

        results = until_written(attempt, f"the events of {len(batch)} jobs", self.health,
                                any_error=True)
        if entries:
            self._tail_long = tail_expiry > self.store.ended_ttl_s
        return results

    def _track_unlogged(self, job: ActiveJob, job_events: JobEvents, result: object,
                        tail_before: int) -> None:
        """Remember which of the job's events are only in the tail now. A fenced job's
        are left where they are: the claim that fenced it moved them into the log."""
        if result == AppendResult.FENCED or job_events.moved:
            self._forget_unlogged(job)
        elif job_events.events:
            job.unlogged.extend(data for _, _, data in job_events.events)
            job.unlogged_last = job_events.events[-1][0]
            if job.unlogged_since is None:
                job.unlogged_since = tail_before
                self._unlogged[job] = None

    def _forget_unlogged(self, job: ActiveJob) -> None:
        job.unlogged = []
        job.unlogged_since = None
        self._unlogged.pop(job, None)

    def _move_unlogged(self, job: ActiveJob) -> None:
        """Write the job's tail-only events into its log as this run lets go of it
        (nothing when another run has claimed the job since: it moved them itself)."""
        if job.unlogged:
            events, last = job.unlogged, job.unlogged_last
            try:
                until_written(
                    lambda: self.store.move_to_log(job.job_id, events, last, job.run_id),
                    f"job {job.job_id}'s events into its log", self.health)
            except Exception:
                log.exception("publisher: could not move job %s's events from the tail to "
                              "its log; its next owner moves them when it claims the job",
                              job.job_id)
        self._forget_unlogged(job)

    def _after_write(self, item: EventItem, result: object, now: float) -> None:
        job = item.job
        if isinstance(result, Exception):
            log.error("publisher: event for job %s failed: %s", job.job_id, result)
        elif result == AppendResult.ALREADY_WRITTEN:
            pass  # an earlier try of this batch wrote it
        elif result == AppendResult.FENCED:
            log.warning("publisher: job %s is owned by another worker now; dropping it",
                        job.job_id)
            job.fenced = True
            if item.outcome is not None:
                job.finish(Outcome.FENCED)  # the engine has already let go of the job
            else:
                self.on_fenced(job)  # stop it in the engine; its end comes as a DoneItem
            return
        if isinstance(item.event, Tokens) and item.event.token_ids:
            if job.first_token_at is None:
                job.first_token_at = now
                self.metrics.ttft.observe(max(0.0, now - job.enqueued_at))
            elif job.last_token_at is not None:
                self.metrics.itl.observe(now - job.last_token_at)
            job.last_token_at = now
            self.metrics.generated_tokens.inc(len(item.event.token_ids))
        if item.outcome is not None:
            self.metrics.e2e.observe(max(0.0, now - job.enqueued_at))
            self.metrics.jobs.labels(outcome=item.outcome).inc()
            self.metrics.vllm.request_ended(item.event, job.enqueued_at, job.claimed_at, now)
            job.finish(item.outcome, item.event)

    def _hand_back(self, job: ActiveJob) -> None:
        """Let another worker continue the job: mark, send a copy, release the lease
        (each step held and retried while Redis refuses; a copy sent twice is dropped by
        its claim)."""
        self._move_unlogged(job)
        try:
            if until_written(lambda: self.store.mark_handback(job.job_id, job.run_id),
                             f"the hand-back of job {job.job_id}", self.health):
                until_written(lambda: self.requeue(job.job_id, job.payload_json),
                              f"the copy of job {job.job_id}", self.health)
                until_written(lambda: self.store.release_handback(job.job_id, job.run_id),
                              f"the release of job {job.job_id}", self.health)
            self.metrics.jobs.labels(outcome=Outcome.HANDBACK).inc()
        except Exception:
            log.exception("publisher: hand-back of job %s failed; its lease will expire and "
                          "another worker will take it over", job.job_id)
        job.finish(Outcome.HANDBACK)
