"""``AsyncStream``: one job's events, in order, exactly once, or a typed error.

Delivery rules (the job's log is the source of truth, pub/sub is the fast path):
- events are delivered in ``seq`` order; a seq already delivered is dropped;
- an event ahead of the next expected seq is buffered and the gap is read from the
  log and the owner's tail (``kvrelay.event_log.read_after``): the worker writes there
  before publishing, so whatever was published before it is already there;
- after the dispatcher reconnects it drops a ``RESYNC`` marker: re-read the log, and
  read it again a few times over the next seconds while no event comes (writes the
  workers held through the outage land later, ``ResyncFollowUp``);
- the log is read a page (``_LOG_PAGE`` entries) at a time, the next page once the
  previous one is delivered: a resumed stream of a long job holds one page, not its log;
- no event for ``stream_timeout`` seconds: read the log once, then ``StreamTimeout``;
- past the job's ``timeout``: ``DeadlineExceeded``.

Leaving before the terminal event (``break`` + leaving ``async with``, ``aclose()``,
the task cancelled, a client-side timeout) aborts the job; leaving after it sends
nothing. A stream from ``resume`` only observes: leaving it aborts nothing unless it was
opened with ``abort_on_exit=True``. A new job carries a ``queue_deadline``: no worker
starts it later, and until its first event the stream waits that long (plus a grace).
A stream of a job this client started listens on the client's reply channel; one that
attaches to a job started elsewhere (``resume``, or a retry whose job already existed)
counts itself among the job's watchers and listens on the job's own channel. The normal
path costs one deque pop and one msgspec decode per published batch of the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import typing
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from kvrelay.async_resource import AsyncResource
from kvrelay.completion import Completion, CompletionBuilder, StreamChunk
from kvrelay.errors import Cancelled, KvrelayError, error_for_code
from kvrelay.event_filter import ImpossibleEvents
from kvrelay.protocol import Failed, Finished, GenerateRequest, Started, Tokens
from kvrelay.stream_events import CLOSED as _CLOSED
from kvrelay.stream_events import DONE as _DONE
from kvrelay.stream_events import LIVE as _LIVE
from kvrelay.stream_events import NEW as _NEW
from kvrelay.stream_events import STARTING as _STARTING
from kvrelay.stream_events import Event, GapRetry, ResyncFollowUp
from kvrelay.stream_mailbox import Mailbox
from kvrelay.stream_start import StreamStart
from kvrelay.tenant_quota import TenantQuota
from kvrelay.tracing.job_trace import JobTrace

if typing.TYPE_CHECKING:
    from kvrelay.job_lifecycle import JobLifecycle

__all__ = ["AsyncStream"]

log = logging.getLogger("kvrelay.stream")

# Events one stream may deliver back to back before it yields to the event loop.
_MAX_BURST: Final = 64


class AsyncStream(StreamStart, AsyncResource):
    """The events of one job as ``StreamChunk``s; ``final()`` gives the ``Completion``.

    Use as ``async with client.stream(...) as stream: async for chunk in stream: ...``.
    Iterating without ``async with`` also starts the job; then call ``aclose()`` if
    you stop early, or the job keeps running until it ends on its own.
    """

    def __init__(
        self,
        jobs: JobLifecycle,
        *,
        job_id: str,
        request: GenerateRequest | None,
        stream_timeout: float,
        timeout: float | None = None,
        after_seq: int = -1,
        queue_timeout: float | None = None,
        abort_on_exit: bool = True,
        keep_output: bool = True,
        still_known: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._jobs = jobs
        self._job_id = job_id
        self._request = request
        model = request.model if request is not None else None
        n = request.sampling.n if request is not None else 1
        self._builder = CompletionBuilder(job_id, model=model, n=n, keep_output=keep_output)
        self._stream_timeout = stream_timeout
        self._timeout = timeout
        # None: the job may wait in the queue as long as ``stream_timeout``.
        self._queue_timeout = queue_timeout
        self._abort_on_exit_wanted = abort_on_exit
        # A resume: whether the job still has a trace anywhere (``EventOrder._confirm_known``).
        self._still_known = still_known
        self._state: str = _NEW
        self._mailbox: Mailbox | None = None
        # A resume delivers from ``after_seq + 1`` on; earlier events only feed ``final()``.
        self._next_seq = 0 if request is not None else after_seq + 1
        self._filter = ImpossibleEvents(job_id, n if request is not None else None)
        self._pending: dict[int, Event] = {}
        # Client-side clocks (loop time): the job's deadline, the last event.
        self._deadline: float | None = None
        self._last_progress = 0.0
        self._gap = GapRetry()
        self._follow_up = ResyncFollowUp()
        self._completion: Completion | None = None
        self._error: KvrelayError | None = None
        self._abort_on_exit = self._busy = False
        # Counted among the job's watchers (listening on its own channel), and this
        # stream's member of the set of every watching stream (``Keyspace.watching``).
        self._watching = False
        self._watch_token = uuid.uuid4().hex
        self._loop: asyncio.AbstractEventLoop | None = None
        # Events handed out since this stream last let the loop run (see ``__anext__``).
        self._burst = 0
        # The last log read stopped at a page's end: more of the log follows it.
        self._log_more = False
        # The tenant quota the job was admitted under, and in how many of its counts the
        # job still is (2: jobs and queued; 1: jobs, once started; 0: none).
        self._quota: TenantQuota | None = None
        self._quota_counted = 0
        # The job's spans on this side (None: tracing is off, or a resume).
        self._trace: JobTrace | None = None

    # ------------------------------------------------------------------ properties

    @property
    def job_id(self) -> str:
        return self._job_id

    @property
    def request(self) -> GenerateRequest | None:
        """The request sent (None for a stream obtained with ``resume``)."""
        return self._request

    @property
    def worker(self) -> str | None:
        """The worker (``host:pid``) that started the job last; None before it started."""
        return self._builder.worker

    @property
    def last_seq(self) -> int:
        """The seq of the last event delivered (-1 before the first): resume from here."""
        return self._next_seq - 1

    @property
    def done(self) -> bool:
        """True once the job ended (or the stream failed or was closed)."""
        return self._state in (_DONE, _CLOSED)

    @property
    def text(self) -> str:
        """Text of choice 0 delivered so far."""
        return self._builder.text_of(0)

    def set_quota(self, quota: TenantQuota) -> None:
        """Admit this stream's job within ``quota`` (``kvrelay.tenant_quota``): the push
        is refused with ``QueueFull`` past it. Call it before the stream starts."""
        if self._state != _NEW or self._request is None:
            raise RuntimeError("set_quota() must come before a new job's stream starts")
        self._quota = quota

    def discard_output(self) -> None:
        """Keep no tokens, text or logprobs for ``final()`` (its ``Completion`` then has
        only finish reasons, usage and timings): for a caller that forwards each chunk
        and must not hold the whole answer. Call it before the stream starts."""
        if self._state != _NEW:
            raise RuntimeError("discard_output() must come before the stream starts")
        self._builder.keep_output = False

    # ------------------------------------------------------------------ lifecycle

    async def _open(self) -> None:
        await self.start()

    async def start(self) -> None:
        """Subscribe, then enqueue (or, for a resume, read the log). Idempotent."""
        if self._state != _NEW:
            if self._state == _STARTING:
                raise RuntimeError("this stream is already being started by another task")
            return
        self._state = _STARTING
        self._loop = asyncio.get_running_loop()
        try:
            if self._request is not None:
                await self._start_job(self._request)
                if self._trace is not None:
                    self._trace.admitted()
            else:
                await self._start_resume()
        except BaseException as exc:
            if isinstance(exc, KvrelayError):
                self._error = exc
            self._end(_DONE if isinstance(exc, KvrelayError) else _CLOSED)
            raise
        if self._state == _STARTING:
            self._state = _LIVE
            self._last_progress = asyncio.get_running_loop().time()

    def _track(self) -> None:
        """Count this stream among its client's live streams (closed with the client)."""
        self._jobs.track(self)

    def __del__(self) -> None:
        # Dropped while live (iterated without ``async with``, then abandoned): release
        # the subscription and abort, as leaving early would.
        if self._state == _LIVE and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._end, _CLOSED)

    async def aclose(self) -> None:
        """Stop listening; abort the job unless it already ended."""
        if self._state in (_DONE, _CLOSED):
            return
        self._end(_CLOSED)

    def detach(self) -> None:
        """Stop listening but leave the job running, so that it can be resumed later."""
        self._abort_on_exit = False
        if self._state not in (_DONE, _CLOSED):
            self._end(_CLOSED)

    def _end(self, state: str) -> None:
        """Release the subscription; abort the job if it may still be running."""
        self._state = state
        if self._trace is not None:
            self._trace.end(self._error, closed=state == _CLOSED)
            self._trace = None
        if self._mailbox is not None:
            self._jobs.dispatcher.unsubscribe(self._mailbox)
        if self._watching:
            self._watching = False
            self._jobs.unwatch_soon(self._job_id, self._watch_token)
        self._jobs.untrack(self)
        if self._quota_counted and self._quota is not None:
            self._quota_counted = 0
            self._jobs.release_quota(self._quota.tenant, self._job_id, started=False)
        if self._abort_on_exit:
            self._abort_on_exit = False
            self._jobs.abort_soon(self._job_id)

    def _fail(self, error: KvrelayError) -> KvrelayError:
        """End the stream client-side with ``error`` (aborting the job)."""
        self._error = error
        self._end(_DONE)
        return error

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._state == _NEW:
            await self.start()
        if self._busy:
            raise RuntimeError("another task is already iterating this stream")
        self._busy = True
        try:
            while True:
                if self._state in (_DONE, _CLOSED):
                    if self._error is not None:
                        raise self._error
                    raise StopAsyncIteration
                event = await self._next_event()
                self._burst += 1
                if self._burst >= _MAX_BURST:
                    # A backlog (a replayed log, a slow consumer) is served without ever
                    # suspending: yield now and then so other streams are not starved.
                    self._burst = 0
                    await asyncio.sleep(0)
                if type(event) is Tokens:
                    self._builder.add_tokens(event)
                    return StreamChunk(
                        seq=event.seq,
                        index=event.index,
                        text=event.text,
                        token_ids=event.token_ids,
                        logprobs=event.logprobs,
                        reasoning=event.reasoning or "",
                        tool_calls=event.tool_calls,
                        prompt_logprobs=event.prompt_logprobs,
                    )
                self._absorb(event)
        finally:
            self._busy = False

    def _absorb(self, event: Event) -> None:
        """Fold a non-chunk event (or any event, when replaying) into the result."""
        if isinstance(event, Tokens):
            self._builder.add_tokens(event)
        elif isinstance(event, Started):
            self._builder.add_started(event)
            if self._trace is not None:
                self._trace.started(event)
            if self._quota_counted == 2 and self._quota is not None:
                self._quota_counted = 1
                self._jobs.release_quota(self._quota.tenant, self._job_id, started=True)
        elif isinstance(event, Finished):
            self._completion = self._builder.build(event)
            if self._trace is not None:
                self._trace.finished(event)
            self._abort_on_exit = False
            self._end(_DONE)
        elif isinstance(event, Failed):
            self._error = error_for_code(event.code, event.message, job_id=self._job_id)
            self._abort_on_exit = False
            self._end(_DONE)

    @property
    def text_stream(self) -> AsyncIterator[str]:
        """Just the text deltas of choice 0 (empty deltas skipped)."""
        return self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        async for chunk in self:
            if chunk.index == 0 and chunk.text:
                yield chunk.text

    async def final(self) -> Completion:
        """Consume the rest of the stream and return the whole ``Completion``."""
        async for _ in self:
            pass
        if self._error is not None:
            raise self._error
        if self._completion is None:
            raise Cancelled("the stream was closed before the job finished", job_id=self._job_id)
        return self._completion

    # ------------------------------------------------------------------ ordering

    @property
    def ignored_events(self) -> int:
        """Events dropped as impossible (see ``kvrelay.event_filter``)."""
        return self._filter.count
