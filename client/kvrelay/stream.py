"""``AsyncStream``: one job's events, in order, exactly once, or a typed error.

Delivery rules (the job's log is the source of truth, pub/sub is the fast path):
- events are delivered in ``seq`` order; a seq already delivered is dropped;
- an event ahead of the next expected seq is buffered and the gap is read from the
  log and the owner's tail (``kvrelay.event_log.read_after``): the worker writes there
  before publishing, so whatever was published before it is already there;
- after the dispatcher reconnects it drops a ``RESYNC`` marker: re-read the log;
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
import functools
import logging
import time
import typing
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar, Final

import msgspec
import redis.exceptions as redis_exceptions

from kvrelay import event_log
from kvrelay.async_resource import AsyncResource
from kvrelay.completion import Completion, CompletionBuilder, StreamChunk
from kvrelay.connection import REDIS_ERRORS
from kvrelay.dispatcher import RESYNC, Mailbox
from kvrelay.errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    KvrelayError,
    QueueFull,
    QueueTimeout,
    StreamTimeout,
    error_for_code,
)
from kvrelay.event_filter import ImpossibleEvents
from kvrelay.event_frames import unpack_events
from kvrelay.patience import patiently
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    AnyEvent,
    Failed,
    Finished,
    GenerateRequest,
    Started,
    Tokens,
    decode_event,
)
from kvrelay.tenant_quota import UNBOUNDED_JOB_S, TenantQuota, current_quota
from kvrelay.tracing.job_trace import JobTrace, begin_job_trace

if typing.TYPE_CHECKING:
    from kvrelay.job_lifecycle import JobLifecycle

__all__ = ["AsyncStream"]

log = logging.getLogger("kvrelay.stream")

# Entries per XRANGE page: bounds the time one reply takes to parse on the loop.
_LOG_PAGE: Final = 256
# Events one stream may deliver back to back before it yields to the event loop.
_MAX_BURST: Final = 64
# How long past its queue deadline a stream still waits for the first event (a worker
# that picked the job up just in time needs a moment to say so).
_PICKUP_GRACE_S: Final = 5.0


class _SeqOnly(msgspec.Struct):
    seq: int


_seq_decoder = msgspec.msgpack.Decoder(_SeqOnly)
_events_decoder = msgspec.msgpack.Decoder(list[AnyEvent])


class _Unknown:
    """An event this client cannot read (e.g. a newer type): it still takes its seq."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


_Event = AnyEvent | _Unknown


def _decode_all(data: object) -> list[_Event]:
    """The events of an events array (``kvrelay.event_frames``); one that cannot be read
    is skipped, one of an unknown type keeps its seq."""
    if not isinstance(data, (bytes, bytearray, memoryview, msgspec.Raw)):
        return []
    try:
        return list(_events_decoder.decode(data))
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        parts = unpack_events(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        log.warning("dropping an unreadable events array (%d bytes)", len(memoryview(data)))
        return []
    return [event for part in parts if (event := _decode(part)) is not None]


def _decode(data: object) -> _Event | None:
    if isinstance(data, msgspec.Raw):
        data = bytes(data)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    try:
        return decode_event(bytes(data))
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            seq = _seq_decoder.decode(data).seq
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("dropping an unreadable event message (%d bytes)", len(data))
            return None
        log.warning("skipping event seq %d of an unknown type", seq)
        return _Unknown(seq)


class _GapRetry:
    """When to read the log again for a hole it could not fill yet (doubling backoff from
    ``FIRST`` to ``MAX`` seconds; given up after ``TRIES_WITH_TERMINAL`` once the job's
    terminal event is in hand)."""

    FIRST: ClassVar[float] = 0.05
    MAX: ClassVar[float] = 1.0
    TRIES_WITH_TERMINAL: ClassVar[int] = 4

    __slots__ = ("at", "delay", "tries")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.at = 0.0
        self.delay = self.FIRST
        self.tries = 0

    def again(self, now: float) -> None:
        self.tries += 1
        self.at = now + self.delay
        self.delay = min(self.delay * 2, self.MAX)


_NEW: Final = "new"
_STARTING: Final = "starting"
_LIVE: Final = "live"
_DONE: Final = "done"  # terminal event seen, or failed client-side
_CLOSED: Final = "closed"  # left early by the caller


class AsyncStream(AsyncResource):
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
        self._state: str = _NEW
        self._mailbox: Mailbox | None = None
        # A resume delivers from ``after_seq + 1`` on; earlier events only feed ``final()``.
        self._next_seq = 0 if request is not None else after_seq + 1
        self._filter = ImpossibleEvents(job_id, n if request is not None else None)
        self._pending: dict[int, _Event] = {}
        # Client-side clocks (loop time): the job's deadline, the last event.
        self._deadline: float | None = None
        self._last_progress = 0.0
        self._gap = _GapRetry()
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
        self._jobs.track(self)
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
        self._jobs.track(self)
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

    async def _replay_log(self) -> None:
        """Read the log once subscribed (so nothing published from now on is missed), a
        page at a time: events before ``next_seq`` only feed ``final()``; the first page
        that reaches ``next_seq`` waits its turn to be delivered, and the pages after it
        are read as it is (``_log_more``)."""
        after = -1
        while True:
            try:
                replay = await patiently(functools.partial(self._read_log, after_seq=after),
                                         self._jobs.reconnect_timeout)
            except REDIS_ERRORS as exc:
                raise self._jobs.connection_error(
                    exc, f"reading the event log of job {self._job_id}"
                ) from exc
            reached = False
            for event in replay:
                if self._impossible(event, live=False):
                    continue
                after = max(after, event.seq)
                if event.seq < self._next_seq:
                    self._absorb(event)
                    if self._state == _DONE:
                        return
                else:
                    reached = True
                    self._pending.setdefault(event.seq, event)
            if reached or not self._log_more or not replay:
                return

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

    def _absorb(self, event: _Event) -> None:
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

    async def _next_event(self) -> _Event:
        """The event with seq ``next_seq``: from the buffer, the mailbox, or the log."""
        mailbox = self._mailbox
        assert mailbox is not None
        pending = self._pending
        items = mailbox.items
        loop = asyncio.get_running_loop()
        while True:
            if pending:
                event = pending.pop(self._next_seq, None)
                if event is not None:
                    return self._advance(event, loop.time())
            elif self._log_more:
                await self._fill_gap()  # the next page of a long log
                if not pending:  # nothing new there after all: wait as usual
                    self._log_more = False
                continue
            if items:
                item = mailbox.take()
                if item is RESYNC:
                    await self._fill_gap()
                    continue
                for decoded in _decode_all(item):
                    # Seqs already delivered are duplicates; the rest wait their turn.
                    if decoded.seq >= self._next_seq and not self._impossible(decoded, live=True):
                        pending.setdefault(decoded.seq, decoded)
                if pending and self._next_seq not in pending and loop.time() >= self._gap.at:
                    await self._fill_gap()
                continue
            if mailbox.error is not None:
                error = mailbox.error
                raise self._fail(
                    error
                    if isinstance(error, KvrelayError)
                    else InternalError(str(error), job_id=self._job_id)
                )
            idle_limit = self._idle_limit()
            wake_at = self._last_progress + idle_limit
            if self._deadline is not None and self._deadline < wake_at:
                wake_at = self._deadline
            if pending and self._gap.at < wake_at:
                wake_at = self._gap.at
            self._burst = 0
            if await mailbox.wait(loop, wake_at):
                continue
            now = loop.time()
            if self._deadline is not None and now >= self._deadline:
                raise self._fail(
                    DeadlineExceeded(
                        f"the job did not finish within its timeout of {self._timeout:g}s",
                        job_id=self._job_id,
                    )
                )
            if pending and now >= self._gap.at:
                await self._fill_gap()
                continue
            if now >= self._last_progress + idle_limit:
                await self._fill_gap(check=True)
                if self._next_seq in pending:
                    continue
                if self._jobs.dispatcher.connected or mailbox.error is not None:
                    raise self._fail(self._idle_error())
                # Redis is away and the dispatcher is reconnecting: it will either
                # resync us or fail us; do not blame the worker for the outage.
                self._last_progress = now

    @property
    def ignored_events(self) -> int:
        """Events dropped as impossible (see ``kvrelay.event_filter``)."""
        return self._filter.count

    def _impossible(self, event: _Event, *, live: bool) -> bool:
        return self._filter.rejects(event, next_seq=self._next_seq, live=live)

    def _waiting_for_pickup(self) -> bool:
        """A new job with its own queue-wait limit that no worker has reported on yet."""
        return (
            self._queue_timeout is not None and self._request is not None and (self._next_seq == 0)
        )

    def _idle_limit(self) -> float:
        """Seconds without an event before giving up: the queue wait, then the stream's."""
        if self._waiting_for_pickup():
            assert self._queue_timeout is not None
            return self._queue_timeout + _PICKUP_GRACE_S
        return self._stream_timeout

    def _idle_error(self) -> KvrelayError:
        if self._waiting_for_pickup():
            return QueueTimeout(
                f"no worker picked the job up within its queue_timeout of {self._queue_timeout:g}s",
                job_id=self._job_id,
            )
        return StreamTimeout(f"no event for {self._stream_timeout:g}s", job_id=self._job_id)

    def _advance(self, event: _Event, now: float) -> _Event:
        deadline = self._deadline
        if deadline is not None and now >= deadline and not isinstance(event, TERMINAL_EVENTS):
            # Events still flowing past the job's timeout: enforce it here too.
            raise self._fail(
                DeadlineExceeded(
                    f"the job did not finish within its timeout of {self._timeout:g}s",
                    job_id=self._job_id,
                )
            )
        self._next_seq = event.seq + 1
        self._last_progress = now
        if self._gap.tries:
            self._gap.reset()
        return event

    async def _fill_gap(self, *, check: bool = False) -> None:
        """Read the log from ``next_seq`` into the buffer (gap, resync or timeout check)."""
        try:
            events = await self._read_log(after_seq=self._next_seq - 1)
        except REDIS_ERRORS as exc:
            if self._jobs.dispatcher.connected:
                raise self._fail(
                    self._jobs.connection_error(exc, f"reading the event log of job {self._job_id}")
                ) from exc
            events = []  # outage: the dispatcher resyncs us after reconnecting
        except KvrelayError as exc:
            raise self._fail(exc) from None
        pending = self._pending
        for event in events:
            if event.seq >= self._next_seq and not self._impossible(event, live=False):
                pending.setdefault(event.seq, event)
        if not pending or self._next_seq in pending:
            return
        # Still a hole: retry later; give up if the job is over and the log cannot say.
        self._gap.again(asyncio.get_running_loop().time())
        terminal = any(isinstance(e, TERMINAL_EVENTS) for e in pending.values())
        if terminal and self._gap.tries >= _GapRetry.TRIES_WITH_TERMINAL and not check:
            first = min(pending)
            raise self._fail(
                InternalError(
                    f"events {self._next_seq}..{first - 1} are missing from the job's log",
                    job_id=self._job_id,
                )
            )

    async def _read_log(self, *, after_seq: int) -> list[_Event]:
        """The events in one page of the log after ``after_seq`` (maybe a few before it;
        undecodable entries skipped), and the tail's once the log is read to its end
        (``_log_more`` says whether it was)."""
        try:
            found, self._log_more = await event_log.read_some_after(
                self._jobs.redis, self._jobs.keys, self._job_id, after_seq, page=_LOG_PAGE,
                max_pages=1,
            )
        except redis_exceptions.ResponseError as exc:  # e.g. WRONGTYPE, NOPERM
            raise InternalError(
                f"Redis refused to read the job's event log: {exc}", job_id=self._job_id
            ) from exc
        return [event for data in found if (event := _decode(data)) is not None]
