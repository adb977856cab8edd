"""How an ``AsyncStream`` starts (split from ``kvrelay.stream``): a new job subscribes,
reserves its id and is enqueued; a retry of the same request or a resume watches the
job's own channel and replays its log."""

from __future__ import annotations

import asyncio
import time

import msgspec

from kvrelay.connection import REDIS_ERRORS
from kvrelay.errors import QueueFull
from kvrelay.patience import patiently
from kvrelay.protocol import GenerateRequest
from kvrelay.stream_order import EventOrder
from kvrelay.tenant_quota import UNBOUNDED_JOB_S, TenantQuota, current_quota
from kvrelay.tracing.job_trace import JobTrace, begin_job_trace

__all__ = ["StreamStart"]


class StreamStart(EventOrder):
    """Mixed into ``AsyncStream``: the attributes below are its."""

    _trace: JobTrace | None
    _abort_on_exit: bool
    _abort_on_exit_wanted: bool
    _quota: TenantQuota | None
    _quota_counted: int
    _watching: bool
    _watch_token: str

    def _track(self) -> None:
        raise NotImplementedError

    async def _start_job(self, request: GenerateRequest) -> None:
        self._trace = begin_job_trace(request)  # before the job's clock: it holds the job
        # The job's clock starts now, not when the stream object was made.
        now = time.time()
        deadline = None if self._timeout is None else now + self._timeout
        queue_wait = self._stream_timeout if self._queue_timeout is None else self._queue_timeout
        request = msgspec.structs.replace(
            request, deadline=deadline, enqueued_at=now, queue_deadline=now + queue_wait,
            reply_to=self._jobs.reply_channel,
            trace_context=self._trace.carrier() if self._trace is not None else None,
        )
        self._request = request
        if self._timeout is not None:
            self._deadline = asyncio.get_running_loop().time() + self._timeout
        await self._jobs.precheck(request)
        self._mailbox = await self._jobs.dispatcher.subscribe(
            self._job_id, self._jobs.reply_channel, max_bytes=self._jobs.stream_buffer_bytes
        )
        self._track()
        # A retry of the same request (same job_id) attaches to the job it started; a
        # refused id (``JobIdReused``) is another caller's job: never abort it.
        new = await self._jobs.reserve(request)
        # From here on the job may exist: leaving early must abort it.
        self._abort_on_exit = True
        if not new:
            # Its events go to the reply channel of whoever started it: watch it.
            await self._watch()
            await self._replay_log()
            return
        quota = self._quota
        scope = None
        if quota is not None:
            counted_until = request.deadline or (now + UNBOUNDED_JOB_S)
            scope = current_quota.set((quota, counted_until))
        try:
            await self._jobs.enqueue(request)
        except QueueFull:
            self._abort_on_exit = False  # refused: nothing was enqueued, nothing to abort
            raise
        finally:
            if scope is not None:
                current_quota.reset(scope)
        if quota is not None:
            self._quota_counted = 2  # in the tenant's jobs and queued counts

    async def _start_resume(self) -> None:
        self._track()
        await self._watch()
        self._abort_on_exit = self._abort_on_exit_wanted
        if self._timeout is not None:
            self._deadline = asyncio.get_running_loop().time() + self._timeout
        await self._replay_log()

    async def _watch(self) -> None:
        """Listen on the job's own channel and count this stream among its watchers (so
        its worker publishes there too), before the log is read: nothing is missed."""
        dispatcher = self._jobs.dispatcher
        mailbox = await dispatcher.subscribe(
            self._job_id, self._jobs.keys.events_channel(self._job_id),
            max_bytes=self._jobs.stream_buffer_bytes,
        )
        previous, self._mailbox = self._mailbox, mailbox
        if previous is not None:
            dispatcher.unsubscribe(previous)
        try:
            await patiently(lambda: self._jobs.watch(self._job_id, self._watch_token),
                            self._jobs.reconnect_timeout)
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, f"watching job {self._job_id}") from exc
        self._watching = True
