"""The replay log's format: one place for what both sides write and read.

A job's events live in two Redis streams:

- its **log** (``Keyspace.event_log``): each entry holds one or more events as an events
  array (``kvrelay.event_frames``) in field ``e``; its id is ``f"{last_seq}-1"``, the seq
  of its last event (explicit, so the stream refuses a write it already has); a terminal
  entry carries a second field ``t``, so a writer can tell from the last entry alone that
  the job already ended;
- while it runs, the **tail** of the worker that owns it (``Keyspace.worker_tail``, the
  owner named by the job record's ``owner``): one entry per publisher batch, one field per
  job in it, named by the job id, valued ``f"{last_seq}:"`` (``;`` when the events end
  the job) followed by that batch's pair of the job (``[job_id, events]``, as
  published). The worker moves a job's tail events into its log every few batches, when
  it ends, and when it lets go of it; the next owner moves whatever is left when it
  claims the job. The tail keeps more batches than that takes, so every event is in one
  of the two.

"Everything after seq N" is the log's entries from ``(N+1)-0`` on, then the owner's tail
entries past the log's last seq; events at or before N are dropped.

The worker's Lua scripts take these names and their result codes from here (formatted
into the script text), its job store and publisher read the codes by name, the SDK's
stream reads through ``read_after``, and the test and benchmark stand-ins for a worker
write through ``add_entry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, Final

import msgspec

from kvrelay.event_frames import unpack_events, unpack_pair
from kvrelay.keys import Keyspace

__all__ = [
    "DIGEST_FIELD",
    "EVENT_FIELD",
    "LIVE_LOG_TTL_S",
    "OWNER_FIELD",
    "TAIL_ENDED",
    "TAIL_LIVE",
    "TAIL_READ_ENTRIES",
    "TERMINAL_FIELD",
    "AppendResult",
    "add_entry",
    "entry_events",
    "entry_id",
    "first_id_after",
    "read_after",
    "seq_of_entry_id",
    "tail_value",
]

# The field holding an entry's events array, and the marker field of a terminal entry.
EVENT_FIELD: Final = "e"
TERMINAL_FIELD: Final = "t"
# Every entry id is ``{seq}-{ENTRY_ID_SUFFIX}``; ``{seq}-0`` sorts just before it.
ENTRY_ID_SUFFIX: Final = 1
# What separates a tail value's last seq from its events: the events end the job or not.
TAIL_LIVE: Final = ":"
TAIL_ENDED: Final = ";"
# The job record's field (``Keyspace.job_record``) holding ``protocol.request_digest`` of the
# request the job id belongs to: set by the first sender, kept after the job ends (the
# prompt is not), so a retry attaches to the job and a different request is refused.
DIGEST_FIELD: Final = "digest"
# How many of a tail's newest entries a reader looks through: a worker moves a job's
# events into its log within 16 of its batches (``publisher.LOG_MOVE_BATCHES``), so
# those past the log's last entry are among them (a new owner moves a dead one's first).
TAIL_READ_ENTRIES: Final = 32
# The job record's field naming the worker that claimed the job last (its tail holds the
# events not yet in the log).
OWNER_FIELD: Final = "owner"
# How long the log of a job that is still running lives after its latest event: the
# worker's default (``KVRELAY_LOG_LIVE_TTL``); after the terminal event, ``log_ttl``.
LIVE_LOG_TTL_S: Final = 86_400


class AppendResult(IntEnum):
    """What the worker's append scripts answer instead of the seq they wrote."""

    # The job's lease belongs to another worker: nothing written.
    FENCED = -1
    # An unfenced write found the log already ended: nothing written.
    ENDED = -2
    # An unfenced write's ``seq`` was not the next one: read the log again and retry.
    NOT_NEXT = -3
    # The log already has this ``seq`` (an earlier try of the same write got through).
    ALREADY_WRITTEN = -4


def entry_id(seq: int) -> str:
    """The log entry id of an entry whose last event is ``seq``."""
    return f"{seq}-{ENTRY_ID_SUFFIX}"


def first_id_after(seq: int) -> str:
    """The smallest id of any entry holding an event after ``seq`` (an ``XRANGE`` start)."""
    return f"{seq + 1}-0"


def seq_of_entry_id(entry: bytes | str) -> int:
    """The last seq of the entry with this id."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    return int(text.split("-", 1)[0])


def tail_value(last_seq: int, pair: bytes, *, ended: bool) -> bytes:
    """A job's field value in a tail entry (``pair`` from ``pack_pair``)."""
    return f"{last_seq}{TAIL_ENDED if ended else TAIL_LIVE}".encode() + pair


def entry_events(fields: Mapping[Any, Any] | list[Any] | None) -> bytes | None:
    """An entry's events array from its fields: a mapping (redis-py's ``XRANGE``) or the
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


def add_entry(client: Any, job_log: str, last_seq: int, events: bytes, *,
              terminal: bool = False) -> Any:
    """``XADD`` one entry (``events`` from ``pack_events``, the last of them ``last_seq``) as
    the format requires, on any redis-py client or pipeline (sync or async: the call's
    result is returned as is, to be awaited where it must)."""
    fields: dict[str, bytes] = {EVENT_FIELD: events}
    if terminal:
        fields[TERMINAL_FIELD] = b"1"
    return client.xadd(job_log, fields, id=entry_id(last_seq))


def _split(events: bytes | msgspec.Raw) -> list[msgspec.Raw]:
    try:
        return unpack_events(events)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


async def read_after(client: Any, keys: Keyspace, job_id: str, after_seq: int, *,
                     page: int) -> list[msgspec.Raw]:
    """The encoded events after ``after_seq`` in seq order (an entry that spans
    ``after_seq`` brings earlier ones too: callers drop seqs they have): the log's, read ``page``
    entries per ``XRANGE`` (bounding the time one reply takes to parse), then, unless the
    log has ended, the owner's tail past the log's last seq. ``client`` is a
    ``redis.asyncio.Redis`` with bytes replies.

    Not atomic: a batch moved from the tail to the log between the two reads is found in
    neither only if the tail also dropped it meanwhile (many batches later); a reader
    then sees a gap, and reads again."""
    found: list[msgspec.Raw] = []
    job_log = keys.event_log(job_id)
    start = first_id_after(after_seq)
    newest = after_seq
    while True:
        entries: list[Any] = await client.xrange(job_log, min=start, max="+", count=page) or []
        for entry, fields in entries:
            data = entry_events(fields)
            if data is not None:
                found.extend(_split(data))
            newest = max(newest, seq_of_entry_id(entry))
            if TERMINAL_FIELD.encode() in fields or TERMINAL_FIELD in fields:
                return found
        if len(entries) < page:
            break
        start = first_id_after(seq_of_entry_id(entries[-1][0]))
    owner = await client.hget(keys.job_record(job_id), OWNER_FIELD)
    if not owner:
        return found
    newest_first: list[Any] = await client.xrevrange(
        keys.worker_tail(owner.decode()), count=TAIL_READ_ENTRIES) or []
    field = job_id.encode()
    for _entry, fields in reversed(newest_first):
        value = fields.get(field)
        if value is None:
            continue
        # The last seq is the value's leading digits; the separator follows them.
        mark = len(value) - len(value.lstrip(b"0123456789"))
        if mark == 0 or mark == len(value) or int(value[:mark]) <= newest:
            continue
        newest = int(value[:mark])
        try:
            _job_id, events = unpack_pair(value[mark + 1:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        found.extend(_split(events))
    return found
