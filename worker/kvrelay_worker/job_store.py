"""A job's state in Redis: claim, lease, event log, release, hand-back, failover.

Thin, typed wrappers over the Lua scripts in ``redis_scripts``; one instance per thread
that needs one (each owns its Redis connection pool).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from kvrelay import event_log
from kvrelay.event_log import AppendResult
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    AnyEvent,
    Failed,
    Tokens,
    decode_event,
    encode_event,
)
from kvrelay.replica_wait import ReplicaWait
from kvrelay_worker import redis_scripts
from kvrelay_worker.redis_client import replica_wait
from kvrelay_worker.settings import WorkerSettings

# A script, its keys and its arguments.
_ScriptCall = tuple[Script, list[str], list[Any]]


@dataclass
class JobEvents:
    """One job's share of a publisher batch: its events in seq order, already encoded,
    and what to do to its log once they are in."""

    job_id: str
    # (seq, terminal, event bytes) per event.
    events: list[tuple[int, bool, bytes]] = field(default_factory=list)
    # Expiry to set on the log afterwards, in seconds (0: leave it as it is).
    expiry_s: int = 0
    # The oldest seq the log keeps (0: keep all; the byte cap, see ``log_window``).
    keep_from: int = 0


def now_ms() -> int:
    return int(time.time() * 1000)


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
    # (seq, bytes) of every entry, oldest first: where the log's byte cap stands.
    entry_sizes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """The log no longer starts at seq 0 (trimmed): the job cannot be continued."""
        return bool(self.entry_sizes) and self.entry_sizes[0][0] != 0

    @property
    def has_tokens(self) -> bool:
        return any(self.tokens.values())

    def choice_tokens(self, n: int) -> list[list[int]]:
        return [self.tokens.get(i, []) for i in range(n)]

    def choice_texts(self, n: int) -> list[str]:
        return ["".join(self.texts.get(i, [])) for i in range(n)]

    def choice_finish_reasons(self, n: int) -> list[str | None]:
        return [self.finish_reasons.get(i) for i in range(n)]


def progress_from_events(events: list[AnyEvent]) -> PriorProgress:
    progress = PriorProgress()
    for event in events:
        progress.next_seq = max(progress.next_seq, event.seq + 1)
        if isinstance(event, Tokens):
            progress.tokens.setdefault(event.index, []).extend(event.token_ids)
            progress.texts.setdefault(event.index, []).append(event.text)
            if event.finish_reason:
                progress.finish_reasons[event.index] = event.finish_reason
        elif isinstance(event, TERMINAL_EVENTS):
            progress.terminal = True
    return progress


class JobStore:
    """Job-state operations for one worker, over one Redis connection pool."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings) -> None:
        self.redis = client
        self.settings = settings
        self.worker_id = settings.worker_id
        self.keys = settings.keys
        self.running_key = self.keys.running_jobs(settings.served_model)
        flagged = redis_scripts.supports_flags(client)
        script = functools.partial(redis_scripts.register, client, flagged=flagged)
        self._claim = script(redis_scripts.CLAIM)
        self._release_done = script(redis_scripts.RELEASE_DONE)
        self._mark_handback = script(redis_scripts.MARK_HANDBACK)
        self._release_handback = script(redis_scripts.RELEASE_HANDBACK)
        # Keeping a lease alive writes next to nothing; refusing it under memory pressure
        # would only make another worker take the job over.
        self._refresh = script(redis_scripts.REFRESH_LEASE, allow_oom=True)
        self._append = script(redis_scripts.APPEND_EVENT)
        self._append_batch = script(redis_scripts.APPEND_BATCH)
        self._check_expired = script(redis_scripts.CHECK_EXPIRED)
        self._commit_requeue = script(redis_scripts.COMMIT_REQUEUE)
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

    def claim(self, job_id: str, payload_json: str, digest: str) -> Claim:
        """Take the job unless it is done, aborted, owned, or its id belongs to another
        request (``digest``: ``protocol.request_digest``); one round trip."""
        result = self._one(
            self._claim,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
             self.keys.event_log(job_id), self.keys.abort_flag(job_id)],
            [job_id, self.worker_id, self.lease_ms, payload_json, now_ms(),
             self.live_ttl_s, digest],
        )
        status = _text(result[0])
        if status == "claimed":
            entries = [(event_log.seq_of_entry_id(entry_id), data) for entry_id, fields in result[2]
                       if (data := event_log.event_bytes(fields)) is not None]
            progress = progress_from_events([decode_event(data) for _, data in entries])
            progress.entry_sizes = [(seq, len(data)) for seq, data in entries]
            return Claim("claimed", attempt=int(result[1]), progress=progress)
        return Claim(status)

    def release_done(self, job_id: str) -> bool:
        return bool(self._one(
            self._release_done,
            [self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            [job_id, self.worker_id, self.ended_ttl_s],
        ))

    def mark_handback(self, job_id: str) -> bool:
        return bool(self._mark_handback(keys=[self.keys.job_record(job_id), self.keys.lease(job_id)],
                                        args=[self.worker_id]))

    def release_handback(self, job_id: str) -> bool:
        return bool(self._release_handback(
            keys=[self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key],
            args=[job_id, self.worker_id],
        ))

    # -------------------------------------------------------------------- events

    def _append_call(self, job_id: str, event: AnyEvent, fenced: bool,
                     keep_from: int = 0, data: bytes | None = None) -> _ScriptCall:
        terminal = isinstance(event, TERMINAL_EVENTS)
        return (
            self._append,
            [self.keys.event_log(job_id), self.keys.lease(job_id)],
            [self.keys.events_channel(job_id), self.worker_id if fenced else "",
             event.seq, encode_event(event) if data is None else data,
             self.settings.log_max_len,
             1 if terminal else 0, self.ended_ttl_s, self.live_ttl_s, keep_from],
        )

    def append_event(self, job_id: str, event: AnyEvent, *, fenced: bool) -> Any:
        """Append + publish ``event`` at its ``seq``; returns that seq or an ``AppendResult``.

        With ``fenced`` the write happens only while this worker holds the job's lease, so
        a worker presumed dead can never interleave events with its successor.
        """
        script, key_list, args = self._append_call(job_id, event, fenced)
        return script(keys=key_list, args=args)

    def append_events(self, events: Sequence[tuple[str, AnyEvent]], *, fenced: bool,
                      keep_from: Sequence[int] | None = None,
                      encoded: Sequence[bytes] | None = None) -> list[Any]:
        """``append_event`` for many (job id, event) pairs in one round trip; each result
        in place (an exception object for a write Redis refused). ``keep_from``: per
        event, the oldest seq its log keeps (0: all); ``encoded``: the events already
        encoded (``encode_event``), so a caller that needed the bytes encodes only once."""
        starts = keep_from or [0] * len(events)
        datas: Sequence[bytes | None] = encoded or [None] * len(events)
        return self._pipelined([
            self._append_call(job_id, e, fenced, start, data)
            for (job_id, e), start, data in zip(events, starts, datas, strict=True)])

    def append_batch(self, jobs: Sequence[JobEvents]) -> list[Any]:
        """Append and publish every job's events, fenced by each job's lease, in one
        script call: per event its seq or an ``AppendResult``, jobs in the order given.

        A write Redis refuses (e.g. out of memory) comes back as that exception in every
        event's place; unreachable Redis raises. Run by SHA alone, loaded again when the
        server lost it (restart).
        """
        key_list: list[str] = []
        args: list[Any] = [self.worker_id, self.settings.log_max_len]
        for job in jobs:
            key_list += [self.keys.event_log(job.job_id), self.keys.lease(job.job_id)]
            args += [self.keys.events_channel(job.job_id), job.expiry_s, job.keep_from,
                     len(job.events)]
            for seq, terminal, data in job.events:
                args += [seq, 1 if terminal else 0, data]
        count = sum(len(job.events) for job in jobs)
        if not count:
            return []
        # Through ``_pipelined``: a lost script is loaded again, and behind sentinels the
        # batch counts as written only once a replica holds it.
        results = self._pipelined([(self._append_batch, key_list, args)])[0]
        if isinstance(results, redis.ResponseError):
            return [results] * count
        return list(results)

    def _pipelined(self, calls: list[_ScriptCall]) -> list[Any]:
        """Run script calls in one pipelined round trip, by their SHA alone.

        redis-py, given a script on a pipeline, first asks ``SCRIPT EXISTS`` in a round trip
        of its own; here a script missing from the server (Redis restarted) fails with
        ``NoScriptError`` instead, and only those calls are sent again once it is loaded.
        """
        results = self._send_calls(calls)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                self.redis.script_load(script.script)
            for i, result in zip(missing, self._send_calls([calls[i] for i in missing]),
                                 strict=True):
                results[i] = result
        return results

    def _one(self, script: Script, key_list: list[str], args: list[Any]) -> Any:
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
            pipe.evalsha(script.sha, len(key_list), *key_list, *args)
        wanted = self._replica_wait.wanted()
        if wanted > 0:
            pipe.execute_command("WAIT", wanted, self._replica_wait.timeout_ms)
            *results, acknowledged = pipe.execute(raise_on_error=False)
            self._replica_wait.observe(acknowledged)
            return results
        return list(pipe.execute(raise_on_error=False))

    def append_unowned(self, job_id: str, event: AnyEvent) -> int:
        """Append ``event`` after the log's last entry, for a job no worker holds.

        Returns the seq it got, or ``AppendResult.ENDED`` when the log already ended
        (nothing written).
        """
        for _ in range(16):
            last: list[tuple[bytes, Any]] = self.redis.xrevrange(  # type: ignore[assignment]
                self.keys.event_log(job_id), count=1)
            event.seq = event_log.seq_of_entry_id(last[0][0]) + 1 if last else 0
            result = int(self.append_event(job_id, event, fenced=False))
            if result != AppendResult.NOT_NEXT:
                return result
        raise RuntimeError(f"could not append to the log of job {job_id}: too much contention")

    def fail_unclaimed(self, job_id: str, code: str, message: str) -> int:
        """Report a job that never ran (bad payload, deadline, cancelled) and end it."""
        seq = self.append_unowned(job_id, Failed(seq=0, code=code, message=message))
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.job_record(job_id), "state", "done")
        pipe.hdel(self.keys.job_record(job_id), "payload")
        pipe.expire(self.keys.job_record(job_id), self.ended_ttl_s)
        pipe.execute()
        return seq

    # ----------------------------------------------------------- leases/failover

    def refresh_leases(self, job_ids: list[str]) -> dict[str, bool]:
        """Extend the leases this worker holds; False for a job whose lease it lost."""
        if not job_ids:
            return {}
        now = now_ms()
        results = self._pipelined([
            (self._refresh, [self.keys.lease(job_id), self.running_key],
             [job_id, self.worker_id, self.lease_ms, now])
            for job_id in job_ids
        ])
        for result in results:
            if isinstance(result, Exception):
                raise result
        return {j: bool(r) for j, r in zip(job_ids, results, strict=True)}

    def aborted(self, job_ids: list[str]) -> list[str]:
        if not job_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.exists(self.keys.abort_flag(job_id))
        return [j for j, hit in zip(job_ids, pipe.execute(), strict=True) if hit]

    def expired_candidates(self, limit: int = 100) -> list[str]:
        """Jobs of this model whose lease expiry (as last refreshed) has passed."""
        ids = self.redis.zrangebyscore(self.running_key, "-inf", now_ms(), start=0, num=limit)
        return [_text(i) for i in ids]

    def check_expired(self, job_id: str) -> tuple[str, str | None]:
        result = self._check_expired(
            keys=[self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
                  self.keys.requeue_marker(job_id)],
            args=[job_id, self.settings.max_attempts, max(self.lease_ms * 2, 10_000),
                  self.ended_ttl_s],
        )
        status = _text(result[0])
        payload = _text(result[1]) if status == "requeue" and len(result) > 1 else None
        return status, payload

    def commit_requeue(self, job_id: str) -> None:
        self._commit_requeue(
            keys=[self.keys.job_record(job_id), self.keys.lease(job_id), self.running_key,
                  self.keys.requeue_marker(job_id)],
            args=[job_id],
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
