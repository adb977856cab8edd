"""How an ``AsyncStream`` orders its job's events and reads the job's log (split from
``kvrelay.stream``, whose docstring states the delivery rules): the event with the next
seq from the buffer, the mailbox or the log; a gap read from the log; the replay after
subscribing; the reads that follow a resync; the idle and deadline limits.

A resume reads the job's record and log together when its replay found nothing to
deliver (``job_lookup.presence``): a job found a moment ago whose log has expired since
(the watch before the read retried its write for up to the reconnect timeout, chaos seed
333) is answered ``UnknownJob`` (its record says it ended, or nothing of it is left),
never a ``StreamTimeout`` after waiting for events that cannot come.

Every read of the log or record is judged by the server that answered it
(``kvrelay.judged_read``): a primary the sentinels replaced still answers, with events
the job's real log never gets, and such a read is made again on the new primary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import typing
from collections.abc import Awaitable, Callable
from typing import Final

import redis.exceptions as redis_exceptions

from kvrelay import event_log
from kvrelay.connection import REDIS_ERRORS
from kvrelay.errors import (
    DeadlineExceeded,
    InternalError,
    KvrelayError,
    QueueTimeout,
    StreamTimeout,
    UnknownJob,
)
from kvrelay.event_filter import ImpossibleEvents
from kvrelay.job_lookup import ENDED, GONE, presence
from kvrelay.judged_read import reread_in_doubt
from kvrelay.patience import patiently
from kvrelay.protocol import TERMINAL_EVENTS, GenerateRequest
from kvrelay.stream_events import DONE as _DONE
from kvrelay.stream_events import Event, GapRetry, ResyncFollowUp, decode_all, decode_one
from kvrelay.stream_mailbox import RESYNC, Mailbox

if typing.TYPE_CHECKING:
    from kvrelay.job_lifecycle import JobLifecycle

log = logging.getLogger("kvrelay.stream")

# Entries per XRANGE page: bounds the time one reply takes to parse on the loop.
_LOG_PAGE: Final = 256
# How long past its queue deadline a stream still waits for the first event (a worker
# that picked the job up just in time needs a moment to say so).
_PICKUP_GRACE_S: Final = 5.0


class EventOrder:
    """Mixed into ``AsyncStream``: the attributes below are its."""

    _jobs: JobLifecycle
    _job_id: str
    _request: GenerateRequest | None
    _state: str
    _mailbox: Mailbox | None
    _pending: dict[int, Event]
    _next_seq: int
    _log_more: bool
    _gap: GapRetry
    _follow_up: ResyncFollowUp
    _filter: ImpossibleEvents
    _deadline: float | None
    _last_progress: float
    _burst: int
    _timeout: float | None
    _stream_timeout: float
    _queue_timeout: float | None
    # For a resume: whether the job still has a trace anywhere (queue, taken, record, log).
    _still_known: Callable[[], Awaitable[bool]] | None

    def _absorb(self, event: Event) -> None:
        raise NotImplementedError

    def _fail(self, error: KvrelayError) -> KvrelayError:
        raise NotImplementedError

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
            if reached:
                return
            if not self._log_more or not replay:
                if self._request is None:  # a resume that found nothing to deliver yet
                    await self._confirm_known()
                return

    async def _next_event(self) -> Event:
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
                    self._follow_up.start(loop.time())
                    continue
                for decoded in decode_all(item):
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
            if self._follow_up.at < wake_at:
                wake_at = self._follow_up.at
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
            if now >= self._follow_up.at:
                self._follow_up.read(now)
                await self._fill_gap(check=True)
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


    def _impossible(self, event: Event, *, live: bool) -> bool:
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

    def _advance(self, event: Event, now: float) -> Event:
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
            events = await reread_in_doubt(
                functools.partial(self._read_log, after_seq=self._next_seq - 1),
                self._jobs.reconnect_timeout)
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
        log.debug("job %s: the log read after seq %d gave %d events", self._job_id,
                  self._next_seq - 1, len(events))
        if not pending or self._next_seq in pending:
            return
        # Still a hole: retry later; give up if the job is over and the log cannot say.
        self._gap.again(asyncio.get_running_loop().time())
        terminal = any(isinstance(e, TERMINAL_EVENTS) for e in pending.values())
        if terminal and self._gap.tries >= GapRetry.TRIES_WITH_TERMINAL and not check:
            first = min(pending)
            raise self._fail(
                InternalError(
                    f"events {self._next_seq}..{first - 1} are missing from the job's log",
                    job_id=self._job_id,
                )
            )

    async def _read_log(self, *, after_seq: int) -> list[Event]:
        """The events in one page of the log after ``after_seq`` (maybe a few before it;
        undecodable entries skipped), and the tail's once the log is read to its end
        (``_log_more`` says whether it was)."""
        try:
            found, self._log_more = await event_log.read_some_after(
                self._jobs.redis, self._jobs.keys, self._job_id, after_seq, page=_LOG_PAGE,
                max_pages=1, run=self._jobs.judged_read,
            )
        except redis_exceptions.ResponseError as exc:  # e.g. WRONGTYPE, NOPERM
            raise InternalError(
                f"Redis refused to read the job's event log: {exc}", job_id=self._job_id
            ) from exc
        return [event for data in found if (event := decode_one(data)) is not None]


    async def _confirm_known(self) -> None:
        """The replay of a resume found nothing to deliver: the job is live (its log or
        its record says so; what it writes next reaches this stream, which is subscribed
        and counted), or it ended and its log expired since it was found, or nothing of
        it is left: then ``UnknownJob``, at once."""
        try:
            found = await patiently(
                lambda: presence(self._jobs.redis, self._jobs.keys, self._job_id,
                                 run=self._jobs.judged_read),
                self._jobs.reconnect_timeout)
            known = found != GONE or (self._still_known is not None
                                      and await self._still_known())
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, f"looking up job {self._job_id}") from exc
        if found == ENDED:
            raise UnknownJob("the job ended more than KVRELAY_LOG_TTL (1 h by default) ago: "
                             "its log expired, only its end is known", job_id=self._job_id)
        if not known:
            raise UnknownJob("no such job: it ended and its log expired while this stream "
                             "was being opened", job_id=self._job_id)
