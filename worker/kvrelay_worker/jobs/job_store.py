"""A job's state in Redis: claim, lease, event log, release, hand-back, failover.

Thin, typed wrappers over the Lua scripts in ``kvrelay.job_scripts``; one instance per thread
that needs one (each owns its Redis connection pool).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from kvrelay import event_log, job_scripts
from kvrelay.event_frames import pack_events, pack_message, pack_pair, unpack_events
from kvrelay.event_log import AppendResult
from kvrelay.lua_library import LIBRARY
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    AnyEvent,
    Failed,
    Tokens,
    ToolCallDelta,
    decode_event,
    encode_event,
)
from kvrelay.redis_functions import Functions, LuaScript, is_missing
from kvrelay.replica_wait import ReplicaWait
from kvrelay_worker.redis_client import replica_wait
from kvrelay_worker.settings import WorkerSettings

# Entries a worker's tail keeps: more batches than any job's events stay only there
# (``publisher.LOG_MOVE_BATCHES``), with room for retried batches.
TAIL_MAX_LEN = 64
# After ``APPEND_BATCH`` refused its fast path, how long batches go straight to the
# per-job check (one refused call per this time, not per batch, while watchers exist).
CHECK_EACH_JOB_FOR_S = 1.0

# A script, its keys and its arguments.
_ScriptCall = tuple[LuaScript, list[str], list[Any]]
# A pub/sub message and its channel.
_Message = tuple[str, bytes]


def _written(result: object) -> bool:
    """An append's answer that says its event is in the log (now, or by an earlier try
    whose reply was lost)."""
    return isinstance(result, int) and (result >= 0 or result == AppendResult.ALREADY_WRITTEN)


@dataclass
class JobEvents:
    """One job's share of a publisher batch: its events in seq order, already encoded,
    where they are published, and what moves into its log this batch."""

    job_id: str
    # The client's reply channel ('' : none, only watchers hear the job).
    reply_to: str = ""
    # (seq, terminal, event bytes) per event.
    events: list[tuple[int, bool, bytes]] = field(default_factory=list)
    # The events (encoded) to write to the log as one entry this batch (none: they stay
    # in the tail for now): those of earlier batches still only in the tail, then these.
    moved: list[bytes] = field(default_factory=list)
    # The seq of the last event in ``moved``.
    moved_last: int = 0
    # Expiry to set on the log after a move, in seconds (0: leave it as it is).
    expiry_s: int = 0
    # The oldest seq the log keeps (0: keep all; the byte cap, see ``log_window``).
    keep_from: int = 0
    # The job ended here with this batch: its lease is released and its record marked
    # done by the same script call (no ``release_done`` of its own).
    release: bool = False
    # The run that writes (``run_id``; '': the worker's id, as a lease set by hand holds).
    run: str = ""

    @property
    def terminal(self) -> bool:
        return any(terminal for _, terminal, _ in self.events)


def now_ms() -> int:
    return int(time.time() * 1000)


def run_id(worker_id: str) -> str:
    """A new run id for one claim by ``worker_id``: what its lease holds."""
    return f"{worker_id}#{secrets.token_hex(6)}"


@dataclass
class Claim:
    """Outcome of trying to take a job: ``claimed`` (with the attempt and what earlier
    attempts reported), ``owned``, ``aborted``, ``done`` or ``reused``."""

    status: str
    attempt: int = 0
    progress: PriorProgress | None = None


@dataclass
class PriorProgress:
    """What earlier attempts already reported, read back from the job's event log."""

    next_seq: int = 0
    terminal: bool = False
    tokens: dict[int, list[int]] = field(default_factory=dict)
    texts: dict[int, list[str]] = field(default_factory=dict)
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # With output parsers: the reasoning text and tool-call pieces sent, per choice.
    reasoning: dict[int, list[str]] = field(default_factory=dict)
    tool_calls: dict[int, list[ToolCallDelta]] = field(default_factory=dict)
    # (last seq, bytes) of every entry, oldest first: where the log's byte cap stands.
    entry_sizes: list[tuple[int, int]] = field(default_factory=list)
    # The seq of the log's first event (None: the log is empty).
    first_seq: int | None = None

    @property
    def truncated(self) -> bool:
        """The log no longer starts at seq 0 (trimmed): the job cannot be continued."""
        return self.first_seq not in (None, 0)

    @property
    def has_tokens(self) -> bool:
        return any(self.tokens.values())

    def choice_tokens(self, n: int) -> list[list[int]]:
        return [self.tokens.get(i, []) for i in range(n)]

    def choice_texts(self, n: int) -> list[str]:
        return ["".join(self.texts.get(i, [])) for i in range(n)]

    def choice_finish_reasons(self, n: int) -> list[str | None]:
        return [self.finish_reasons.get(i) for i in range(n)]

    def choice_reasoning(self, n: int) -> list[str]:
        return ["".join(self.reasoning.get(i, [])) for i in range(n)]

    def choice_tool_calls(self, n: int) -> list[list[ToolCallDelta]]:
        return [self.tool_calls.get(i, []) for i in range(n)]


def progress_from_events(events: list[AnyEvent]) -> PriorProgress:
    progress = PriorProgress()
    for event in events:
        if progress.first_seq is None:
            progress.first_seq = event.seq
        progress.next_seq = max(progress.next_seq, event.seq + 1)
        if isinstance(event, Tokens):
            progress.tokens.setdefault(event.index, []).extend(event.token_ids)
            progress.texts.setdefault(event.index, []).append(event.text)
            if event.reasoning:
                progress.reasoning.setdefault(event.index, []).append(event.reasoning)
            if event.tool_calls:
                progress.tool_calls.setdefault(event.index, []).extend(event.tool_calls)
            if event.finish_reason:
                progress.finish_reasons[event.index] = event.finish_reason
        elif isinstance(event, TERMINAL_EVENTS):
            progress.terminal = True
    return progress


class JobStore:
    """Job-state operations for one worker, over one Redis connection pool."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings, *,
                 functions: bool | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.worker_id = settings.worker_id
        self.keys = settings.keys
        self.running_key = self.keys.running_jobs(settings.served_model)
        # The scripts, as Redis Functions (``functions``: whether the server has them;
        # None: ask it); a worker loads them where they are missing.
        self.scripts = Functions(client, LIBRARY, namespace=self.keys.namespace,
                                 functions=functions)
        self._claim = job_scripts.CLAIM
        self._release_done = job_scripts.RELEASE_DONE
        self._mark_handback = job_scripts.MARK_HANDBACK
        self._release_handback = job_scripts.RELEASE_HANDBACK
        # Keeping a lease alive writes next to nothing; refusing it under memory pressure
        # would only make another worker take the job over (its function is ``allow-oom``).
        self._refresh = job_scripts.REFRESH_LEASES
        self._append = job_scripts.APPEND_EVENT
        self._append_batch = job_scripts.APPEND_BATCH
        self._move_to_log = job_scripts.MOVE_TO_LOG
        self.tail_key = self.keys.worker_tail(self.worker_id)
        # The tail's name less a worker id: the scripts name a previous owner's tail.
        self.tail_prefix = self.keys.worker_tail("")
        # Raised by another worker's claim of one of this worker's jobs; and its prefix,
        # with which a claim names the previous owner's.
        self.fence_key = self.keys.worker_fenced(self.worker_id)
        self.fence_prefix = self.keys.worker_fenced("")
        # A job's record and log names less the job id and closing brace, for the claim,
        # which names the keys of jobs it only learns about in Redis (a previous owner's).
        self.per_job_heads = [name("\0").partition("\0")[0] for name in
                              (self.keys.job_record, self.keys.event_log)]
        self._check_each_until = -float("inf")
        self._check_expired = job_scripts.CHECK_EXPIRED
        self._commit_requeue = job_scripts.COMMIT_REQUEUE
        # Behind sentinels: replicas that must hold a job-state write before it counts.
        self._replica_wait = ReplicaWait(*replica_wait(settings))

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_ttl * 1000)

    @property
    def ended_ttl_s(self) -> int:
        """How long an ended job's record stays: as long as its log, no longer."""
        return max(1, int(self.settings.log_ttl))

    @property
    def live_ttl_s(self) -> int:
        """How long a running job's log and record outlive its latest write."""
        return max(1, int(self.settings.log_live_ttl))

    # ------------------------------------------------------------------ claiming

    def claim(self, job_id: str, payload_json: str, digest: str, run: str = "") -> Claim:
        """Take the job for ``run`` (``run_id``) unless it is done, aborted, owned, or its
        id belongs to another request (``digest``: ``protocol.request_digest``); one
        round trip. Sent again after a lost reply, the same run's claim stands."""
        result = self._one(
            self._claim,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.event_log(job_id), self.keys.abort_flag(job_id)],
            [job_id, self.worker_id, self.lease_ms, payload_json, now_ms(),
             self.live_ttl_s, digest, self.tail_prefix, self.settings.log_max_len,
             self.fence_prefix, run or self.worker_id, *self.per_job_heads,
             self.ended_ttl_s],
        )
        status = _text(result[0])
        if status == "claimed":
            entries = [(event_log.seq_of_entry_id(entry_id), data) for entry_id, fields in result[2]
                       if (data := event_log.entry_events(fields)) is not None]
            events = [decode_event(bytes(raw)) for _, data in entries for raw in unpack_events(data)]
            progress = progress_from_events(events)
            progress.entry_sizes = [(seq, len(data)) for seq, data in entries]
            return Claim("claimed", attempt=int(result[1]), progress=progress)
        return Claim(status)

    def release_done(self, job_id: str, run: str = "") -> bool:
        return bool(self._one(
            self._release_done,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            [job_id, run or self.worker_id, self.ended_ttl_s],
        ))

    def mark_handback(self, job_id: str, run: str = "") -> bool:
        return bool(self._one(self._mark_handback,
                              [self.keys.job_record(job_id), self.keys.lease(job_id),
                               self.running_key],
                              [run or self.worker_id, job_id]))

    def release_handback(self, job_id: str, run: str = "") -> bool:
        return bool(self._one(
            self._release_handback,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            [job_id, run or self.worker_id],
        ))

    # -------------------------------------------------------------------- events

    def _append_call(self, job_id: str, event: AnyEvent, fenced: bool | str, reply_to: str,
                     keep_from: int = 0, data: bytes | None = None, *, defer: bool = False
                     ) -> tuple[_ScriptCall, list[_Message]]:
        """``APPEND_EVENT``'s call, and (``defer``) the messages to publish once it is
        written and acknowledged, which the script then leaves out."""
        terminal = isinstance(event, TERMINAL_EVENTS)
        events = pack_events([encode_event(event) if data is None else data])
        message = pack_message([pack_pair(job_id, events)])
        channels = [c for c in (reply_to, self.keys.events_channel(job_id)) if c]
        call = (
            self._append,
            [self.keys.event_log(job_id), self.keys.lease(job_id), self.keys.job_record(job_id)],
            ["" if defer else reply_to, "" if defer else self.keys.events_channel(job_id),
             _fence_run(fenced, self.worker_id), event.seq, events, message,
             self.settings.log_max_len, 1 if terminal else 0, self.ended_ttl_s,
             self.live_ttl_s, keep_from, self.tail_prefix, job_id],
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
        last owner left in its tail. Waits for the replicas like every state write.
        """
        defer = self._defer_publish()
        call, messages = self._append_call(job_id, event, fenced, reply_to, defer=defer)
        result = self._one(*call)
        if _written(result):
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
                       if _written(result) for m in messages])
        return results

    def append_batch(self, jobs: Sequence[JobEvents], *, tail_expiry_s: int = 0) -> list[Any]:
        """Write and publish every job's events in one script call
        (``job_scripts.APPEND_BATCH``), releasing the jobs marked ``release``: per job
        1 (written) or ``AppendResult.FENCED``, in the order given. No job is checked
        while this worker's fence flag is down and
        no stream watches a job; otherwise each job's lease is, and a batch with fenced
        jobs is sent again without them (the script writes nothing when any lease is
        someone else's).

        A write Redis refuses (e.g. out of memory) comes back as that exception in every
        job's place; unreachable Redis raises. Run by SHA alone, loaded again when the
        server lost it (restart).
        """
        results: list[Any] = [1] * len(jobs)
        live = [i for i, job in enumerate(jobs) if job.events or job.moved]
        check_each = time.monotonic() < self._check_each_until
        defer = self._defer_publish()
        while live:
            call, messages = self._batch_call([jobs[i] for i in live], tail_expiry_s,
                                              check_each, defer)
            reply = self._pipelined([call])[0]
            if isinstance(reply, Exception):
                return [reply] * len(jobs)
            if not check_each and [int(r) for r in reply] == [job_scripts.CHECK_EACH_JOB]:
                # Fenced jobs or watchers somewhere: check each job for a while, rather
                # than pay a refused fast call per batch.
                check_each = True
                self._check_each_until = time.monotonic() + CHECK_EACH_JOB_FOR_S
                continue
            fenced = {live[int(position) - 1] for position in reply}
            if not fenced:
                self._publish(messages)
                break
            for i in fenced:
                results[i] = AppendResult.FENCED
            live = [i for i in live if i not in fenced]
        return results

    def _batch_call(self, jobs: Sequence[JobEvents], tail_expiry_s: int, check_each: bool,
                    defer: bool = False) -> tuple[_ScriptCall, list[_Message]]:
        """``APPEND_BATCH``'s keys and arguments: everything packed here, Lua only fences
        (and, on its fast path, not even that: no per-job key or argument at all); and
        (``defer``) the messages to publish once the batch is written and acknowledged,
        which the script then leaves out (each job with events on its own channel too,
        when jobs are checked: the script's watcher counts stay in Redis)."""
        head, _, tail = self.keys.events_channel("\0").partition("\0")
        key_list = [self.tail_key, self.fence_key, self.keys.watching]
        per_job: list[Any] = []
        records: list[bytes] = []
        messages: dict[str, list[bytes]] = {}
        move_keys: list[str] = []
        moves: list[Any] = []
        for job in jobs:
            job_id = job.job_id
            pair = b""
            if job.events:
                events = pack_events([data for _, _, data in job.events])
                pair = pack_pair(job_id, events)
                records.append(event_log.tail_record(job_id, job.events[-1][0], events,
                                                     ended=job.terminal))
                if job.reply_to:
                    messages.setdefault(job.reply_to, []).append(pair)
            if check_each:
                key_list += [self.keys.lease(job_id), self.keys.watchers(job_id),
                             self.keys.job_record(job_id)]
                per_job += [job_id, pair, job.run or self.worker_id]
            if job.moved:
                move_keys.append(self.keys.event_log(job_id))
                moves += [job.moved_last, pack_events(job.moved), 1 if job.terminal else 0,
                          job.keep_from, job.expiry_s]
        packed = [(channel, pack_message(pairs)) for channel, pairs in messages.items()]
        deferred: list[_Message] = []
        if defer:
            deferred = list(packed)
            if check_each:
                deferred += [(self.keys.events_channel(job_id), pack_message([pair]))
                             for job_id, pair in zip(per_job[0::3], per_job[1::3], strict=True)
                             if pair]
            packed, head = [], ""
        per_message: list[Any] = [part for channel_message in packed
                                  for part in channel_message]
        released = [job for job in jobs if job.release]
        release_keys = [self.running_key] if released else []
        release_args: list[Any] = []
        for job in released:
            release_keys += [self.keys.job_record(job.job_id), self.keys.lease(job.job_id)]
            release_args += [job.job_id, job.run or self.worker_id]
        args: list[Any] = [self.worker_id, self.settings.log_max_len, TAIL_MAX_LEN,
                           tail_expiry_s, len(per_job) // 3, len(packed), len(move_keys),
                           head, tail, b"".join(records), len(released), self.ended_ttl_s,
                           *per_job, *per_message, *moves, *release_args]
        return (self._append_batch, key_list + move_keys + release_keys, args), deferred

    def move_to_log(self, job_id: str, events: Sequence[bytes], last_seq: int,
                    run: str = "") -> bool:
        """Write ``events`` (this run's, only in its tail so far) to the job's log as one
        entry; False when the log already has them or another run has claimed the job."""
        return bool(self._one(
            self._move_to_log, [self.keys.event_log(job_id), self.keys.job_record(job_id)],
            [last_seq, pack_events(events), self.settings.log_max_len, self.live_ttl_s,
             run or self.worker_id]))

    def _pipelined(self, calls: list[_ScriptCall]) -> list[Any]:
        """Run script calls in one pipelined round trip, by name (``FCALL``; ``EVALSHA``
        without functions) alone.

        A script missing from the server (Redis restarted without persistence, or
        ``FUNCTION FLUSH``) fails with an error reply; the library is loaded again and
        only those calls are sent again (a user that may not load: ``FunctionsMissing``).
        """
        results = self._send_calls(calls)
        missing = [i for i, r in enumerate(results) if is_missing(r)]
        if missing:
            self.scripts.load()
            for i, result in zip(missing, self._send_calls([calls[i] for i in missing]),
                                 strict=True):
                results[i] = result
        return results

    def _one(self, script: LuaScript, key_list: list[str], args: list[Any]) -> Any:
        """One script call through ``_pipelined`` (so it gets the replica WAIT too)."""
        result = self._pipelined([(script, key_list, args)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _send_calls(self, calls: list[_ScriptCall]) -> list[Any]:
        """The calls in one round trip; behind sentinels a ``WAIT`` closes it, so they
        count as written only once a replica holds them (a failover cannot lose them;
        a connection lost before the reply makes the caller send them again)."""
        pipe = self.redis.pipeline(transaction=False)
        for script, key_list, args in calls:
            self.scripts.queue(pipe, script, key_list, args)
        return self._execute(pipe)

    def _defer_publish(self) -> bool:
        """Whether the next write's events are published only after its ``WAIT``: behind
        sentinels a client never sees an event that a failover could still lose (at a
        takeover the next run would write another event under its seq)."""
        return self._replica_wait.wanted() > 0

    def _publish(self, messages: Sequence[_Message]) -> None:
        """Publish what a deferred write left out, in one round trip (a lost connection
        raises: the write is sent again, and readers drop the seqs they already have)."""
        if not messages:
            return
        pipe = self.redis.pipeline(transaction=False)
        for channel, message in messages:
            pipe.publish(channel, message)
        pipe.execute()

    def _execute(self, pipe: Any) -> list[Any]:
        """Send a pipeline of writes; behind sentinels closed by a ``WAIT`` (its reply
        left out). Error replies come back in place."""
        wanted = self._replica_wait.wanted()
        acknowledged: object = None
        if wanted > 0:
            pipe.execute_command("WAIT", wanted, self._replica_wait.timeout_ms)
            *results, acknowledged = pipe.execute(raise_on_error=False)
        else:
            results = list(pipe.execute(raise_on_error=False))
        self._replica_wait.settle(acknowledged, self.redis.connection_pool)
        return results

    def append_unowned(self, job_id: str, event: AnyEvent, *, reply_to: str = "") -> int:
        """Append ``event`` after the job's last event, for a job no worker holds (what
        its last owner left in its tail is moved into the log first).

        Returns the seq it got, or ``AppendResult.ENDED`` when the log already ended
        (nothing written).
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
        """Report a job that never ran (bad payload, deadline, cancelled) and end it."""
        seq = self.append_unowned(job_id, Failed(seq=0, code=code, message=message),
                                  reply_to=reply_to)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.job_record(job_id), "state", "done")
        pipe.hdel(self.keys.job_record(job_id), "payload")
        pipe.expire(self.keys.job_record(job_id), self.ended_ttl_s)
        for reply in self._execute(pipe):
            if isinstance(reply, Exception):
                raise reply
        return seq

    # ----------------------------------------------------------- leases/failover

    def refresh_leases(self, job_ids: list[str], runs: Sequence[str] | None = None
                       ) -> tuple[list[str], list[str]]:
        """Extend the leases of the runs this worker holds (``runs``, per job; default:
        the worker's id), in one script call: the jobs whose lease it lost (another run
        owns them now), and the jobs whose abort flag is set. A lease that expired while
        Redis was out of reach is taken again if no other run claimed the job since."""
        if not job_ids:
            return [], []
        key_list = [self.running_key]
        args: list[Any] = [self.lease_ms, now_ms()]
        for job_id, run in zip(job_ids, runs or [self.worker_id] * len(job_ids), strict=True):
            key_list += [self.keys.lease(job_id), self.keys.abort_flag(job_id),
                         self.keys.job_record(job_id)]
            args += [job_id, run]
        codes = self._one(self._refresh, key_list, args)
        lost = [j for j, code in zip(job_ids, codes, strict=True) if not int(code) & 1]
        aborted = [j for j, code in zip(job_ids, codes, strict=True) if int(code) & 2]
        return lost, aborted

    def expired_candidates(self, limit: int = 100) -> list[str]:
        """Jobs of this model whose lease expiry (as last refreshed) has passed."""
        ids = self.redis.zrangebyscore(self.running_key, "-inf", now_ms(), start=0, num=limit)
        return [_text(i) for i in ids]

    def check_expired(self, job_id: str) -> tuple[str, str | None, str]:
        """(status, payload, the run that lost its lease: '' unless requeued)."""
        result = self._one(
            self._check_expired,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.requeue_marker(job_id)],
            [job_id, self.settings.max_attempts, max(self.lease_ms * 2, 10_000),
             self.ended_ttl_s],
        )
        status = _text(result[0])
        payload = _text(result[1]) if len(result) > 1 and result[1] else None
        lost_run = _text(result[2]) if len(result) > 2 else ""
        return status, payload, lost_run

    def commit_requeue(self, job_id: str, lost_run: str = "") -> None:
        self._one(
            self._commit_requeue,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.requeue_marker(job_id)],
            [job_id, lost_run],
        )


def _fence_run(fenced: bool | str, worker_id: str) -> str:
    """``APPEND_EVENT``'s run argument: '' (unfenced), or the run the write is fenced by."""
    if isinstance(fenced, str):
        return fenced
    return worker_id if fenced else ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
