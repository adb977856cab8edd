"""One stream's inbox: what the dispatcher's reader task hands a stream, in order.

The reader drops each job's events, still encoded, into the ``Mailbox`` of every stream
of that job; the stream takes them in arrival order. Markers travel the same way:
``RESYNC`` tells a stream that events may have been missed while the connection was
down, so it re-reads the job's log from its last seq.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

import msgspec

from kvrelay.errors import SlowReader

__all__ = ["DEFAULT_STREAM_BUFFER_BYTES", "RESYNC", "MailItem", "Mailbox"]


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


# What one stream may hold of events its reader has not taken yet, by default.
DEFAULT_STREAM_BUFFER_BYTES: Final = 16 << 20

# Put in a mailbox after a reconnect: "events may have been missed, re-read the log".
RESYNC: Final = _Marker("RESYNC")

# A job's events array as published (``kvrelay.event_frames``), or a marker.
MailItem = msgspec.Raw | bytes | _Marker


class Mailbox:
    """One stream's inbox: its job's events arrays and markers in arrival order.

    Its timer is lazy: armed for the earliest deadline asked for and left alone while
    later deadlines come and go, so the per-event path schedules no timer at all. A
    wake-up for an older, earlier deadline is spurious; ``wait`` callers re-check.

    It holds at most ``max_bytes`` of events: a reader that falls further behind is
    failed with ``SlowReader`` (what was waiting is dropped at once, and whatever comes
    after), so one stalled reader cannot grow the process without bound. Its job is
    aborted when the stream ends on that error, as for any stream left early.
    """

    __slots__ = ("buffered", "channel", "error", "items", "job_id", "max_bytes", "timer",
                 "timer_at", "waiter")

    def __init__(self, job_id: str, channel: bytes, max_bytes: int | None = None) -> None:
        self.job_id = job_id
        self.channel = channel
        self.items: deque[MailItem] = deque()
        self.waiter: asyncio.Future[bool] | None = None
        self.error: BaseException | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.max_bytes = max_bytes
        self.buffered = 0

    def put(self, item: MailItem) -> None:
        if self.max_bytes is not None and not isinstance(item, _Marker):
            if isinstance(self.error, SlowReader):
                return
            self.buffered += len(item)
            if self.buffered > self.max_bytes:
                self.items.clear()
                self.buffered = 0
                self.error = None
                self.fail(SlowReader(
                    f"the reader fell more than {self.max_bytes} bytes of events behind",
                    job_id=self.job_id))
                return
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def take(self) -> MailItem:
        """The oldest item (``items`` must not be empty)."""
        item = self.items.popleft()
        if self.max_bytes is not None and not isinstance(item, _Marker):
            self.buffered -= len(item)
        return item

    def fail(self, error: BaseException) -> None:
        """Deliver ``error`` after whatever is already queued (the stream raises it)."""
        if self.error is None:
            self.error = error
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def wait(self, loop: asyncio.AbstractEventLoop, deadline: float) -> bool:
        """Wait for an item or an error (True) or a timer at or before ``deadline`` (False)."""
        if self.items or self.error is not None:
            return True
        if self.timer is None or self.timer_at > deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = deadline
            self.timer = loop.call_at(deadline, self._on_timer)
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiter = waiter
        try:
            return await waiter
        finally:
            self.waiter = None

    def _on_timer(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    def close(self) -> None:
        """Cancel the timer (the stream is done with this mailbox)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

