"""The callers: every job of a schedule through the real SDK (``kvrelay.AsyncClient``),
each behaving as its plan says (generate, stream, read slowly, drop the stream and
resume from its last seq, cancel, cancel when a fault says so, or run in a child process
that is SIGKILLed mid-stream: ``chaos.orphan_caller``), recording everything it was
shown.

A careful caller retries what Redis refused before the job was accepted (the same
``job_id``, so a retry attaches to the job instead of starting a second one), a
``resume`` and a ``cancel``; an error once a stream is running is the job's outcome.
Every wait is bounded: the whole workload by ``Workload.run``'s ``bound_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.asyncio import Redis

from chaos.log_read import LogRead, decode_entries
from chaos.orphan_caller import run_orphan
from chaos.reference import job_options
from chaos.schedule import CANCEL, GENERATE, ORPHAN, RACE, RESUME, SLOW, JobPlan, Schedule
from kvrelay import AsyncClient
from kvrelay.connection import make_redis
from kvrelay.errors import InvalidRequest, KvrelayError
from kvrelay.keys import Keyspace
from kvrelay.stream import AsyncStream

KEYS = Keyspace()

# How long a caller keeps retrying a start, a resume or a cancel that Redis refused.
RETRY_FOR_S = 30.0
# Seconds without an event before a stream gives up (longer than any planned fault).
STREAM_TIMEOUT_S = 25.0
# A small schedule's (one worker, no faults): nothing there pauses a live stream for long,
# so a caller waiting out a missing event (a broken variant) need not wait 25 s.
SMALL_STREAM_TIMEOUT_S = 6.0
_RETRYABLE = (KvrelayError, redis.RedisError, OSError)
# How long a caller that is done waits for its job's terminal event to reach the log.
SNAPSHOT_WAIT_S = 3.0


@dataclass(frozen=True)
class Chunk:
    seq: int
    index: int
    token_ids: tuple[int, ...]
    at: float


@dataclass
class JobRun:
    """What one caller did and saw."""

    plan: JobPlan
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    enqueued_at: float | None = None
    queue_deadline: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    # The completion's tokens per choice (for GENERATE, all the caller saw).
    completion: list[list[int]] | None = None
    finish_reasons: list[str | None] = field(default_factory=list)
    outcome: str = "not run"  # "completed", an error class name, or why not
    error: str = ""
    ended_at: float | None = None
    start_errors: list[str] = field(default_factory=list)
    resumes: int = 0
    resume_errors: list[str] = field(default_factory=list)
    cancel_acked_at: float | None = None
    cancel_errors: list[str] = field(default_factory=list)
    live: bool = False
    # The job's log as read when its caller was done (logs expire soon after the end).
    log: LogRead = field(default_factory=LogRead)


class Workload:
    def __init__(self, schedule: Schedule, url: str) -> None:
        self.schedule = schedule
        self.stream_timeout = SMALL_STREAM_TIMEOUT_S if schedule.small else STREAM_TIMEOUT_S
        self.url = url
        self.runs = [JobRun(job) for job in schedule.jobs]
        self._store: Redis | None = None
        # RACE jobs: set (from the fault's thread) when their caller must cancel.
        self._race = {run.plan.index: asyncio.Event() for run in self.runs
                      if run.plan.behaviour == RACE}
        self._loop: asyncio.AbstractEventLoop | None = None

    def cancel_soon(self, index: int) -> None:
        """Have job ``index``'s caller (a RACE job) cancel it now; callable from any
        thread."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._race[index].set)

    def running_jobs(self) -> list[str]:
        return [run.job_id for run in self.runs if run.live and run.chunks]

    async def run(self, t0: float, bound_s: float) -> None:
        """Every job, started at its planned offset from ``t0``; jobs still going after
        ``bound_s`` seconds end with outcome ``unfinished``."""
        self._loop = asyncio.get_running_loop()
        clients = [AsyncClient(self.url, model=self.schedule.model, require_worker=False,
                               stream_timeout=self.stream_timeout, reconnect_timeout=30.0,
                               placement=self.schedule.placement)
                   for _ in range(2)]
        self._store = make_redis(self.url, max_connections=8, connect_timeout=5.0)
        try:
            for client in clients:
                await client.connect()
            tasks = [asyncio.create_task(self._job(clients[i % 2], run, t0))
                     for i, run in enumerate(self.runs)]
            _, pending = await asyncio.wait(tasks, timeout=bound_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for run in self.runs:
                if run.outcome == "not run" or run.live:
                    run.outcome = "unfinished"
                    run.error = f"still running after the workload's {bound_s:g}s bound"
        finally:
            for client in clients:
                await asyncio.wait_for(client.aclose(), 15)
            await self._store.aclose()

    async def _job(self, client: AsyncClient, run: JobRun, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + run.plan.start_at - time.time()))
        if run.plan.behaviour == ORPHAN:
            await run_orphan(self.url, self.schedule.model, run,
                             job_options(run.plan, self.schedule.model), self.schedule.placement)
            await self._snapshot(run)
            return
        stream = await self._start(client, run)
        if stream is None:
            return
        run.live = True
        race = None
        if run.plan.behaviour == RACE:
            race = asyncio.create_task(self._cancel_on_cue(client, run))
        try:
            await self._consume(client, stream, run)
            run.outcome = "completed"
        except Exception as exc:  # the job's outcome, whatever raised it
            run.outcome = type(exc).__name__
            run.error = str(exc)
        finally:
            run.live = False
            run.ended_at = time.time()
            if race is not None:
                if self._race[run.plan.index].is_set():
                    await asyncio.wait([race], timeout=RETRY_FOR_S)
                race.cancel()
        await self._snapshot(run)

    async def _cancel_on_cue(self, client: AsyncClient, run: JobRun) -> None:
        """A RACE job's cancel, sent when its fault kills the worker running it."""
        await self._race[run.plan.index].wait()
        await self._cancel(client, run)

    async def _snapshot(self, run: JobRun) -> None:
        """Read the job's log now, before its short TTL runs out (waiting briefly for its
        terminal event); a read Redis refuses leaves what was read last."""
        assert self._store is not None
        give_up = time.monotonic() + SNAPSHOT_WAIT_S
        pool: Any = self._store.connection_pool
        while True:
            with contextlib.suppress(*_RETRYABLE):
                if hasattr(pool, "get_master_address"):
                    # Behind sentinels, read the primary they name now: a pool's idle
                    # connections to a replaced one would read its stale copy.
                    await pool.get_master_address()
                entries: list[Any] = await self._store.xrange(KEYS.event_log(run.job_id)) or []
                run.log = decode_entries(entries)
            if run.log.ended or time.monotonic() > give_up:
                return
            await asyncio.sleep(0.2)

    async def _start(self, client: AsyncClient, run: JobRun) -> AsyncStream | None:
        options: dict[str, Any] = job_options(run.plan, self.schedule.model)
        give_up = time.monotonic() + RETRY_FOR_S
        while True:
            stream = client.stream(run.plan.prompt, job_id=run.job_id, **options)
            try:
                await stream.start()
            except InvalidRequest as exc:  # e.g. JobIdReused: never a lawful answer here
                run.outcome, run.error = type(exc).__name__, str(exc)
                return None
            except _RETRYABLE as exc:
                run.start_errors.append(f"{type(exc).__name__}: {exc}")
                if time.monotonic() > give_up:
                    run.outcome, run.error = "never started", run.start_errors[-1]
                    return None
                await asyncio.sleep(0.25)
                continue
            request = stream.request
            if request is not None:
                run.enqueued_at, run.queue_deadline = request.enqueued_at, request.queue_deadline
            return stream

    async def _consume(self, client: AsyncClient, stream: AsyncStream, run: JobRun) -> None:
        plan = run.plan
        if plan.behaviour == GENERATE:
            completion = await stream.final()
        else:
            async with stream:
                stream = await self._read(client, stream, run)
                completion = await stream.final()
        run.completion = [c.token_ids for c in completion.choices]
        run.finish_reasons = [c.finish_reason for c in completion.choices]

    async def _read(self, client: AsyncClient, stream: AsyncStream, run: JobRun) -> AsyncStream:
        """Read chunks as the plan says; the stream to finish with (a resumed one after
        a reconnect)."""
        plan = run.plan
        async for chunk in stream:
            run.chunks.append(Chunk(chunk.seq, chunk.index, tuple(chunk.token_ids),
                                    time.time()))
            if plan.behaviour == SLOW:
                await asyncio.sleep(plan.pause_s)
            if len(run.chunks) != plan.at_chunk:
                continue
            if plan.behaviour == CANCEL:
                await self._cancel(client, run)
            elif plan.behaviour == RESUME:
                after = stream.last_seq
                stream.detach()
                await asyncio.sleep(plan.pause_s)
                resumed = await self._resume(client, run, after)
                return await self._read(client, resumed, run)
        return stream

    async def _cancel(self, client: AsyncClient, run: JobRun) -> None:
        give_up = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < give_up:
            try:
                await client.cancel(run.job_id)
            except _RETRYABLE as exc:
                run.cancel_errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.25)
                continue
            run.cancel_acked_at = time.time()
            return

    async def _resume(self, client: AsyncClient, run: JobRun, after: int) -> AsyncStream:
        give_up = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                stream = await client.resume(run.job_id, after_seq=after,
                                             stream_timeout=self.stream_timeout)
            except _RETRYABLE as exc:
                run.resume_errors.append(f"{type(exc).__name__}: {exc}")
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.25)
                continue
            run.resumes += 1
            return stream
