"""A job's log as the checker reads it: its events in seq order and, per event, the run
that wrote the entry holding it (``event_log.RUN_FIELD``; '' where an entry names none,
an ending no run wrote). The runs let the checker see two runs of one job writing after
a fence, which the events alone cannot show when both runs send the same tokens. And
whether the job's record says a worker took its message before its queue deadline
(``event_log.PICKED_FIELD``: the watch gave the message back, or pushed it again after it
was lost on its way), which makes a start past the deadline the product's rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kvrelay.event_frames import unpack_events
from kvrelay.event_log import PICKED_FIELD, entry_events, entry_run
from kvrelay.keys import Keyspace
from kvrelay.protocol import TERMINAL_EVENTS, AnyEvent, decode_event

KEYS = Keyspace()


@dataclass
class LogRead:
    events: list[AnyEvent] = field(default_factory=list)
    # The run id of the entry each event came in, one per event.
    writers: list[str] = field(default_factory=list)
    # The record said the job was taken in time when the log was read.
    picked: bool = False

    @property
    def ended(self) -> bool:
        return bool(self.events) and isinstance(self.events[-1], TERMINAL_EVENTS)


def decode_entries(entries: Iterable[tuple[Any, Any]]) -> LogRead:
    """A ``LogRead`` from ``XRANGE``'s ``(id, fields)`` pairs."""
    read = LogRead()
    for _, fields in entries:
        data = entry_events(fields)
        if data is None:
            continue
        writer = entry_run(fields)
        for raw in unpack_events(data):
            read.events.append(decode_event(bytes(raw)))
            read.writers.append(writer)
    return read


def read_log(client: Any, job_id: str) -> LogRead:
    """The job's log through a synchronous redis-py client (bytes replies)."""
    read = decode_entries(client.xrange(KEYS.event_log(job_id)) or [])
    read.picked = client.hget(KEYS.job_record(job_id), PICKED_FIELD) is not None
    return read


def longer(a: LogRead, b: LogRead) -> LogRead:
    """Of two reads of one log, the one that ends the job, else the longer."""
    chosen = max(a, b, key=lambda read: (read.ended, len(read.events)))
    return replace(chosen, picked=a.picked or b.picked)
