"""The replay log's format: one place for what both sides write and read.

A job's log is a Redis stream (``Keyspace.event_log``). Each event is one entry whose id is
``f"{seq}-1"`` (explicit, so the stream refuses a ``seq`` it already has) with the field
``e`` holding the msgpack event; a terminal event carries a second field ``t``, so a
writer can tell from the last entry alone that the job already ended. "Everything after
seq N" is ``XRANGE log (N+1)-0 +``.

The worker's Lua scripts take these names and their result codes from here (formatted
into the script text), its job store and publisher read the codes by name, the SDK's
stream reads the log through ``read_after``, and the test and benchmark stand-ins for a
worker write through ``add_entry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, Final

__all__ = [
    "DIGEST_FIELD",
    "EVENT_FIELD",
    "LIVE_LOG_TTL_S",
    "TERMINAL_FIELD",
    "AppendResult",
    "add_entry",
    "entry_id",
    "event_bytes",
    "first_id_after",
    "read_after",
    "seq_of_entry_id",
]

# The field holding an entry's event bytes, and the marker field of a terminal entry.
EVENT_FIELD: Final = "e"
TERMINAL_FIELD: Final = "t"
# Every entry id is ``{seq}-{ENTRY_ID_SUFFIX}``; ``{seq}-0`` sorts just before it.
ENTRY_ID_SUFFIX: Final = 1
# The job record's field (``Keyspace.job_record``) holding ``protocol.request_digest`` of the
# request the job id belongs to: set by the first sender, kept after the job ends (the
# prompt is not), so a retry attaches to the job and a different request is refused.
DIGEST_FIELD: Final = "digest"
# How long the log of a job that is still running lives after its latest event: the
# worker's default (``KVRELAY_LOG_LIVE_TTL``); after the terminal event, ``log_ttl``.
LIVE_LOG_TTL_S: Final = 86_400


class AppendResult(IntEnum):
    """What the worker's append script answers instead of the seq it wrote."""

    # The job's lease belongs to another worker: nothing written.
    FENCED = -1
    # An unfenced write found the log already ended: nothing written.
    ENDED = -2
    # An unfenced write's ``seq`` was not the next one: read the log again and retry.
    NOT_NEXT = -3
    # The log already has this ``seq`` (an earlier try of the same write got through).
    ALREADY_WRITTEN = -4


def entry_id(seq: int) -> str:
    """The log entry id of event ``seq``."""
    return f"{seq}-{ENTRY_ID_SUFFIX}"


def first_id_after(seq: int) -> str:
    """The smallest entry id of any event after ``seq`` (an ``XRANGE`` start)."""
    return f"{seq + 1}-0"


def seq_of_entry_id(entry: bytes | str) -> int:
    """The ``seq`` an entry id stands for."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    return int(text.split("-", 1)[0])


def event_bytes(fields: Mapping[Any, Any] | list[Any] | None) -> bytes | None:
    """An entry's event bytes from its fields: a mapping (redis-py's ``XRANGE``) or the
    flat ``[name, value, ...]`` list a Lua script returns; None when absent."""
    if not fields:
        return None
    if isinstance(fields, Mapping):
        value = fields.get(EVENT_FIELD.encode(), fields.get(EVENT_FIELD))
        return bytes(value) if value is not None else None
    for i in range(0, len(fields) - 1, 2):
        if fields[i] in (EVENT_FIELD, EVENT_FIELD.encode()):
            return bytes(fields[i + 1])
    return None


def add_entry(client: Any, job_log: str, seq: int, data: bytes, *, terminal: bool = False) -> Any:
    """``XADD`` one event as the format requires, on any redis-py client or pipeline (sync
    or async: the call's result is returned as is, to be awaited where it must)."""
    fields: dict[str, bytes] = {EVENT_FIELD: data}
    if terminal:
        fields[TERMINAL_FIELD] = b"1"
    return client.xadd(job_log, fields, id=entry_id(seq))


async def read_after(client: Any, job_log: str, after_seq: int, *, page: int) -> list[bytes]:
    """The event bytes of every entry after ``after_seq``, read ``page`` entries per
    ``XRANGE`` (bounding the time one reply takes to parse); entries without an event
    are skipped. ``client`` is a ``redis.asyncio.Redis`` with bytes replies."""
    found: list[bytes] = []
    start = first_id_after(after_seq)
    while True:
        entries: list[Any] = await client.xrange(job_log, min=start, max="+", count=page) or []
        for _entry_id, fields in entries:
            data = event_bytes(fields)
            if data is not None:
                found.append(data)
        if len(entries) < page:
            return found
        start = first_id_after(seq_of_entry_id(entries[-1][0]))
