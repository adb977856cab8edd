"""What a stream reads off the wire and the log: events decoded leniently (one that
cannot be read is skipped, one of a newer type keeps its seq), and when to read the log
again for a hole (``GapRetry``). Split from ``kvrelay.stream``."""

from __future__ import annotations

import logging
import math
from typing import ClassVar, Final

import msgspec

from kvrelay.event_frames import unpack_events
from kvrelay.protocol import AnyEvent, decode_event

__all__ = ["CLOSED", "DONE", "LIVE", "NEW", "STARTING", "Event", "GapRetry", "UnknownEvent",
           "decode_all", "decode_one"]

log = logging.getLogger("kvrelay.stream")

# A stream's states.
NEW: Final = "new"
STARTING: Final = "starting"
LIVE: Final = "live"
DONE: Final = "done"  # terminal event seen, or failed client-side
CLOSED: Final = "closed"  # left early by the caller


class _SeqOnly(msgspec.Struct):
    seq: int


_seq_decoder = msgspec.msgpack.Decoder(_SeqOnly)
_events_decoder = msgspec.msgpack.Decoder(list[AnyEvent])


class UnknownEvent:
    """An event this client cannot read (e.g. a newer type): it still takes its seq."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq = seq


Event = AnyEvent | UnknownEvent


def decode_all(data: object) -> list[Event]:
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
    return [event for part in parts if (event := decode_one(part)) is not None]


def decode_one(data: object) -> Event | None:
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
        return UnknownEvent(seq)


class GapRetry:
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


class ResyncFollowUp:
    """When a stream reads the log again after a resync while no event comes.

    A worker's writes held through the outage that made the pub/sub connection reconnect
    (a failover, refused writes) land when the worker sends them again, which may be
    after the resync's own read, and their publish may have reached the server this
    stream's connection had just left: the stream would hear nothing more, with the end
    of its job in the log, until its ``stream_timeout`` (chaos seed 10022). So after a
    resync the log is read again ``FIRST``, then twice as long, ... seconds on, ``READS``
    times in all, whenever the stream is idle then."""

    FIRST: ClassVar[float] = 0.5
    READS: ClassVar[int] = 5

    __slots__ = ("at", "delay", "left")

    def __init__(self) -> None:
        self.at = math.inf
        self.delay = self.FIRST
        self.left = 0

    def start(self, now: float) -> None:
        """A resync was read at ``now``."""
        self.delay = self.FIRST
        self.at = now + self.delay
        self.left = self.READS

    def read(self, now: float) -> None:
        """A follow-up read was made at ``now``: schedule the next, if any is left."""
        self.left -= 1
        self.delay *= 2
        self.at = now + self.delay if self.left > 0 else math.inf
