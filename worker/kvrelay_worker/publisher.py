"""The publisher thread: every event leaves the worker here, one pipeline per batch.

The engine thread hands over a batch per step and never waits. This thread numbers each
job's events (``seq``), merges consecutive token events of one choice when it has fallen
behind, and sends the whole batch in one pipelined round trip: for each event one script
call that appends it to the job's log (fenced by the lease) and publishes it. After a
job's terminal event is written the job's task thread is woken.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from kvrelay.event_log import AppendResult
from kvrelay.protocol import AnyEvent, Tokens, encode_event
from kvrelay_worker.active_job import ActiveJob, Outcome
from kvrelay_worker.job_store import JobStore
from kvrelay_worker.log_window import LogWindow
from kvrelay_worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)


@dataclass
class EventItem:
    job: ActiveJob
    event: AnyEvent
    # For a terminal event: the outcome to record once it is written.
    outcome: str | None = None


@dataclass
class HandbackItem:
    """Give the job back to the queue after its earlier events are written."""

    job: ActiveJob


@dataclass
class DoneItem:
    """End a job without an event (fenced: another worker owns it now)."""

    job: ActiveJob
    outcome: str


Item = EventItem | HandbackItem | DoneItem

_STOP = object()


class Publisher:
    def __init__(self, store: JobStore, metrics: WorkerMetrics,
                 requeue: Callable[[str, str], None],
                 on_fenced: Callable[[ActiveJob], None]) -> None:
        self.store = store
        self.metrics = metrics
        self.requeue = requeue
        self.on_fenced = on_fenced
        self._queue: queue.SimpleQueue[list[Item] | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kvrelay-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def put(self, items: list[Item]) -> None:
        if items:
            self._queue.put(items)

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
                self._process(coalesce(items))

    def _process(self, items: list[Item]) -> None:
        events = [i for i in items if isinstance(i, EventItem)]
        keep_from: list[int] = []
        encoded: list[bytes] = []  # once per event: its size for the window, then the write
        for item in events:
            job = item.job
            item.event.seq = job.next_seq
            job.next_seq += 1
            if job.log_window is None:
                job.log_window = LogWindow(self.store.settings.log_max_bytes,
                                           job.prior.entry_sizes)
            data = encode_event(item.event)
            encoded.append(data)
            keep_from.append(job.log_window.add(item.event.seq, len(data)))
        results = self._send(events, keep_from, encoded)
        now = time.time()
        for item, result in zip(events, results, strict=True):
            self._after_write(item, result, now)
        for other in items:
            if isinstance(other, HandbackItem):
                self._hand_back(other.job)
            elif isinstance(other, DoneItem):
                other.job.finish(other.outcome)

    def _send(self, events: list[EventItem], keep_from: list[int],
              encoded: list[bytes]) -> list[object]:
        """One pipelined round trip; retried while Redis is unreachable, and the writes
        it refuses for want of memory retried (in order) until they are written: an
        event is never taken for written, nor its job for finished, before it is."""
        results: list[object] = [None] * len(events)
        todo = list(range(len(events)))
        delay = 0.05
        while todo:
            try:
                sent = self.store.append_events(
                    [(events[i].job.job_id, events[i].event) for i in todo], fenced=True,
                    keep_from=[keep_from[i] for i in todo], encoded=[encoded[i] for i in todo])
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("publisher: Redis unreachable (%s); retrying in %.2fs", exc, delay)
            else:
                for i, result in zip(todo, sent, strict=True):
                    results[i] = result
                todo = [i for i in todo if isinstance(results[i], redis.OutOfMemoryError)]
                if not todo:
                    break
                log.warning("publisher: Redis is out of memory; %d events wait, retrying in "
                            "%.2fs", len(todo), delay)
            time.sleep(delay)
            # Capped low: behind sentinels the new primary is up within a second or two of
            # the old one's death, and each step of backoff past that is a stall.
            delay = min(delay * 2, 0.5)
        return results

    def _after_write(self, item: EventItem, result: object, now: float) -> None:
        job = item.job
        if isinstance(result, Exception):
            log.error("publisher: event for job %s failed: %s", job.job_id, result)
        elif result == AppendResult.ALREADY_WRITTEN:
            pass  # an earlier try of this batch wrote it
        elif result == AppendResult.FENCED:
            log.warning("publisher: job %s is owned by another worker now; dropping it",
                        job.job_id)
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
            job.finish(item.outcome)

    def _hand_back(self, job: ActiveJob) -> None:
        """Let another worker continue the job: mark, send a copy, release the lease."""
        try:
            if self.store.mark_handback(job.job_id):
                self.requeue(job.job_id, job.payload_json)
                self.store.release_handback(job.job_id)
            self.metrics.jobs.labels(outcome=Outcome.HANDBACK).inc()
        except Exception:
            log.exception("publisher: hand-back of job %s failed; its lease will expire and "
                          "another worker will take it over", job.job_id)
        job.finish(Outcome.HANDBACK)


def coalesce(items: list[Item]) -> list[Item]:
    """Merge runs of token events of one job and choice into one event each.

    Only events with nothing else of that job between them merge, so each job's event
    order is kept; other jobs' events may sit between them.
    """
    out: list[Item] = []
    # Per job, its last token event when nothing else of the job came after it.
    open_tokens: dict[ActiveJob, Tokens] = {}
    for item in items:
        event = item.event if isinstance(item, EventItem) else None
        if isinstance(event, Tokens):
            prev = open_tokens.get(item.job)
            if prev is not None and prev.index == event.index and prev.finish_reason is None:
                _merge_tokens(prev, event)
                continue
            open_tokens[item.job] = event
        else:
            open_tokens.pop(item.job, None)
        out.append(item)
    return out


def _merge_tokens(into: Tokens, extra: Tokens) -> None:
    """Append ``extra`` to ``into`` in place (both are this batch's own events)."""
    into.token_ids.extend(extra.token_ids)
    into.text += extra.text
    if extra.logprobs is not None:
        if into.logprobs is None:
            into.logprobs = []
        into.logprobs.extend(extra.logprobs)
    into.finish_reason = extra.finish_reason
    into.cumulative_logprob = extra.cumulative_logprob
    into.beam_score = extra.beam_score


