"""A job's state in Redis: claim, event log, release, and the endings of jobs no run holds.

Thin, typed wrappers over the Lua scripts in ``kvrelay.job_scripts`` and
``kvrelay.log_scripts`` (lease upkeep and failover: ``lease_ops``; how calls go out:
``store_calls``); one instance per thread that needs one (each owns its Redis connection
pool).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from kvrelay import event_log, job_scripts, log_scripts
from kvrelay.event_frames import pack_events, pack_message, pack_pair, unpack_events
from kvrelay.event_log import AppendResult
from kvrelay.job_script_helpers import CHECK_EACH_JOB
from kvrelay.protocol import TERMINAL_EVENTS, AnyEvent, Failed, decode_event, encode_event
from kvrelay_worker.jobs.batch_call import TAIL_MAX_LEN, JobEvents, batch_call
from kvrelay_worker.jobs.lease_ops import LeaseOps, LeaseRefresh
from kvrelay_worker.jobs.prior_progress import Claim, PriorProgress, progress_from_events
from kvrelay_worker.jobs.recent_endings import RecentEndings
from kvrelay_worker.jobs.store_calls import Message, ScriptCall, now_ms, run_id, text, written
from kvrelay_worker.settings import WorkerSettings

__all__ = ["TAIL_MAX_LEN", "Claim", "JobEvents", "JobStore", "LeaseRefresh", "PriorProgress",
           "now_ms", "progress_from_events", "run_id"]

# After ``APPEND_BATCH`` refused its fast path, how long batches go straight to the
# per-job check (one refused call per this time, not per batch, while watchers exist).
CHECK_EACH_JOB_FOR_S = 1.0


class JobStore(LeaseOps):
    """Job-state operations for one worker, over one Redis connection pool."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings, *,
                 functions: bool | None = None) -> None:
        super().__init__(client, settings, functions=functions)
        # A job's record and log names less the job id and closing brace, for the claim,
        # which names the keys of jobs it only learns about in Redis (a previous owner's).
        self.per_job_heads = [name("\0").partition("\0")[0] for name in
                              (self.keys.job_record, self.keys.event_log)]
        self._check_each_until = -float("inf")
        # The jobs this store's runs ended lately (written again after an outage).
        self.endings = RecentEndings()

    # ------------------------------------------------------------------ claiming

    def claim(self, job_id: str, payload_json: str, digest: str, run: str = "") -> Claim:
        """Take the job for ``run`` (``run_id``) unless it is done, aborted, owned, or its
        id belongs to another request (``digest``: ``protocol.request_digest``); one
        round trip. Sent again after a lost reply, the same run's claim stands."""
        result = self._one(
            job_scripts.CLAIM,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.event_log(job_id), self.keys.abort_flag(job_id), self.fresh_key],
            [job_id, self.worker_id, self.lease_ms, payload_json, self.live_ttl_s, digest,
             self.tail_prefix, self.settings.log_max_len, self.fence_prefix,
             run or self.worker_id, *self.per_job_heads, self.ended_ttl_s],
        )
        status = text(result[0])
        if status == "claimed":
            entries = [(event_log.seq_of_entry_id(entry_id), data) for entry_id, fields in result[2]
                       if (data := event_log.entry_events(fields)) is not None]
            events = [decode_event(bytes(raw)) for _, data in entries for raw in unpack_events(data)]
            progress = progress_from_events(events)
            progress.entry_sizes = [(seq, len(data)) for seq, data in entries]
            return Claim("claimed", attempt=int(result[1]), progress=progress)
        return Claim(status)

    def release_done(self, job_id: str, run: str = "") -> bool:
        released = bool(self._one(
            job_scripts.RELEASE_DONE,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            [job_id, run or self.worker_id, self.ended_ttl_s],
        ))
        if released:
            self.endings.add(job_id, run or self.worker_id)
        return released

    # -------------------------------------------------------------------- events

    def _append_call(self, job_id: str, event: AnyEvent, fenced: bool | str, reply_to: str,
                     keep_from: int = 0, data: bytes | None = None, *, defer: bool = False
                     ) -> tuple[ScriptCall, list[Message]]:
        """``APPEND_EVENT``'s call, and (``defer``) the messages to publish once it is
        written and acknowledged, which the script then leaves out."""
        terminal = isinstance(event, TERMINAL_EVENTS)
        events = pack_events([encode_event(event) if data is None else data])
        message = pack_message([pack_pair(job_id, events)])
        channels = [c for c in (reply_to, self.keys.events_channel(job_id)) if c]
        call = (
            log_scripts.APPEND_EVENT,
            [self.keys.event_log(job_id), self.keys.lease(job_id), self.keys.job_record(job_id),
             self.running_key, self.fresh_key],
            ["" if defer else reply_to, "" if defer else self.keys.events_channel(job_id),
             _fence_run(fenced, self.worker_id), event.seq, events, message,
             self.settings.log_max_len, 1 if terminal else 0, self.ended_ttl_s,
             self.live_ttl_s, keep_from, self.tail_prefix, job_id, self.fence_prefix,
             *self.per_job_heads],
        )
        return call, [(c, message) for c in channels] if defer else []

    def append_event(self, job_id: str, event: AnyEvent, *, fenced: bool | str,
                     reply_to: str = "") -> Any:
        """Append + publish ``event`` at its ``seq`` (on ``reply_to`` when given, and on the
        job's own channel); returns that seq or an ``AppendResult``. Not for a job whose
        events go through ``append_batch``.

        With ``fenced`` (True: this worker's id; or a run id) the write happens only while
        that run holds the job's lease, so a worker presumed dead can never interleave
        events with its successor; without, it first moves into the log what the job's
        last owner left in its tail, and a terminal event ends the job for good (the run
        its record named is fenced). Nothing is written after a terminal event. Waits for
        the replicas like every state write.
        """
        defer = self._defer_publish()
        call, messages = self._append_call(job_id, event, fenced, reply_to, defer=defer)
        result = self._one(*call)
        if written(result):
            self._publish(messages)
        return result

    def append_events(self, events: Sequence[tuple[str, AnyEvent]], *, fenced: bool | str,
                      keep_from: Sequence[int] | None = None,
                      encoded: Sequence[bytes] | None = None) -> list[Any]:
        """``append_event`` for many (job id, event) pairs in one round trip; each result
        in place (an exception object for a write Redis refused). ``keep_from``: per
        event, the oldest seq its log keeps (0: all); ``encoded``: the events already
        encoded (``encode_event``), so a caller that needed the bytes encodes only once."""
        starts = keep_from or [0] * len(events)
        datas: Sequence[bytes | None] = encoded or [None] * len(events)
        defer = self._defer_publish()
        calls = [self._append_call(job_id, e, fenced, "", start, data, defer=defer)
                 for (job_id, e), start, data in zip(events, starts, datas, strict=True)]
        results = self._pipelined([call for call, _ in calls])
        self._publish([m for (_, messages), result in zip(calls, results, strict=True)
                       if written(result) for m in messages])
        return results

    def append_batch(self, jobs: Sequence[JobEvents], *, tail_expiry_s: int = 0) -> list[Any]:
        """Write and publish every job's events in one script call
        (``log_scripts.APPEND_BATCH``), releasing the jobs marked ``release``: per job
        1 (written) or ``AppendResult.FENCED``, in the order given. No job is checked
        while this worker's fence flag is down and no stream watches a job; otherwise
        each job's lease is, and a batch with fenced jobs is sent again without them (the
        script writes nothing when any lease is someone else's, or any job's record no
        longer names the run: ended by another party).

        A write Redis refuses (e.g. out of memory) comes back as that exception in every
        job's place; unreachable Redis raises. Run by SHA alone, loaded again when the
        server lost it (restart).
        """
        results: list[Any] = [1] * len(jobs)
        live = [i for i, job in enumerate(jobs) if job.events or job.moved]
        check_each = time.monotonic() < self._check_each_until
        defer = self._defer_publish()
        while live:
            call, messages = batch_call(self, [jobs[i] for i in live], tail_expiry_s,
                                        check_each, defer)
            reply = self._pipelined([call])[0]
            if isinstance(reply, Exception):
                return [reply] * len(jobs)
            if not check_each and [int(r) for r in reply] == [CHECK_EACH_JOB]:
                # Fenced jobs or watchers somewhere: check each job for a while, rather
                # than pay a refused fast call per batch.
                check_each = True
                self._check_each_until = time.monotonic() + CHECK_EACH_JOB_FOR_S
                continue
            fenced = {live[int(position) - 1] for position in reply}
            if not fenced:
                self._publish(messages)
                for i in live:
                    if jobs[i].release:
                        self.endings.add(jobs[i].job_id, jobs[i].run or self.worker_id)
                break
            for i in fenced:
                results[i] = AppendResult.FENCED
            live = [i for i in live if i not in fenced]
        return results

    def move_to_log(self, job_id: str, events: Sequence[bytes], last_seq: int,
                    run: str = "") -> bool:
        """Write ``events`` (this run's, only in its tail so far) to the job's log as one
        entry; False when the log already has them or has ended, or another run has
        claimed the job (or another party ended it)."""
        return bool(self._one(
            log_scripts.MOVE_TO_LOG, [self.keys.event_log(job_id), self.keys.job_record(job_id)],
            [last_seq, pack_events(events), self.settings.log_max_len, self.live_ttl_s,
             run or self.worker_id]))

    # ------------------------------------------------------------ unowned endings

    def append_unowned(self, job_id: str, event: AnyEvent, *, reply_to: str = "") -> int:
        """Append ``event`` after the job's last event, for a job no worker holds (what
        its last owner left in its tail is moved into the log first). A terminal event
        ends the job for good in the same call: its record says done and names no run,
        and the worker of the run it named is fenced (a stalled run writes nothing more).

        Returns the seq it got, or ``AppendResult.ENDED`` when the log already ended
        (nothing written; the record is marked done).
        """
        # The first try (seq 0) settles the tail; a log that already holds events answers
        # NOT_NEXT, and the next try follows its last entry.
        event.seq = 0
        for _ in range(16):
            result = int(self.append_event(job_id, event, fenced=False, reply_to=reply_to))
            if result != AppendResult.NOT_NEXT:
                return result
            last: list[tuple[bytes, Any]] = self.redis.xrevrange(  # type: ignore[assignment]
                self.keys.event_log(job_id), count=1)
            event.seq = event_log.seq_of_entry_id(last[0][0]) + 1 if last else 0
        raise RuntimeError(f"could not append to the log of job {job_id}: too much contention")

    def fail_unclaimed(self, job_id: str, code: str, message: str, *, reply_to: str = "") -> int:
        """Report a job that this worker did not run (bad payload, deadline, cancelled)
        and end it for good, fencing whichever run held it before."""
        return self.append_unowned(job_id, Failed(seq=0, code=code, message=message),
                                   reply_to=reply_to)


def _fence_run(fenced: bool | str, worker_id: str) -> str:
    """``APPEND_EVENT``'s run argument: '' (unfenced), or the run the write is fenced by."""
    if isinstance(fenced, str):
        return fenced
    return worker_id if fenced else ""
