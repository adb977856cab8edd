"""The replay log's format: one place for what both sides write and read.

A job's events live in two Redis streams:

- its **log** (``Keyspace.event_log``): each entry holds one or more events as an events
  array (``kvrelay.event_frames``) in field ``e``; its id is ``f"{last_seq}-1"``, the seq
  of its last event (explicit, so the stream refuses a write it already has); a terminal
  entry carries a second field ``t``, so a writer can tell from the last entry alone that
  the job already ended, and the worker's scripts then set the stream's last id to the
  highest there is (``ENDED_LAST_ID``), so Redis itself refuses any entry after it;
  an entry also names the run that wrote its events (field ``r``: the claim's run id, as
  the job's lease holds it), which no reader of events needs: it lets an audit tell two
  runs of one job apart (none: an ending written by no run, a cancel at pickup, say);
- while it runs, the **tail** of the worker that owns it (``Keyspace.worker_tail``, the
  owner named by the job record's ``owner``): one entry per publisher batch, with one
  field ``b`` holding every job of the batch as a record (``tail_record``: the job id, its
  last seq in the batch, whether the events end the job, and its events array), one
  string for the whole batch so that Redis handles one value per batch, not one per job.
  The worker moves a job's tail events into its log every few batches, when it ends, and
  when it lets go of it; the next owner moves whatever is left when it claims the job
  (the first claim from a worker that holds none of its jobs any more moves every job's
  and deletes the tail). The tail keeps more batches than that takes, and lives as long
  as a running job's log while it holds events in no log yet, so every event is in one
  of the two.

"Everything after seq N" is the log's entries from ``(N+1)-0`` on, then the owner's tail
entries past the log's last seq; events at or before N are dropped.

The worker's Lua scripts take these names and their result codes from here (formatted
into the script text), its job store and publisher read the codes by name, the SDK's
stream reads through ``read_after``, and the test and benchmark stand-ins for a worker
write through ``add_entry``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from enum import IntEnum
from typing import Any, Final

import msgspec

from kvrelay.event_frames import unpack_events
from kvrelay.judged_read import PipelineRun, plain_run
from kvrelay.keys import Keyspace

__all__ = [
    "DIGEST_FIELD",
    "ENDED_LAST_ID",
    "EVENT_FIELD",
    "LIVE_LOG_TTL_S",
    "MESSAGE_CHECKS_FIELD",
    "MESSAGE_FIELD",
    "OWNER_FIELD",
    "PICKED_FIELD",
    "RUN_FIELD",
    "TAIL_FIELD",
    "TAIL_READ_ENTRIES",
    "TERMINAL_FIELD",
    "AppendResult",
    "add_entry",
    "entry_events",
    "entry_id",
    "entry_run",
    "first_id_after",
    "read_after",
    "read_some_after",
    "seq_of_entry_id",
    "tail_record",
    "tail_records",
]

# The field holding an entry's events array, and the marker field of a terminal entry.
EVENT_FIELD: Final = "e"
TERMINAL_FIELD: Final = "t"
# Every entry id is ``{seq}-{ENTRY_ID_SUFFIX}``; ``{seq}-0`` sorts just before it.
ENTRY_ID_SUFFIX: Final = 1
# A log's last id once its terminal entry is in (``XSETID``): every later ``XADD`` fails
# as "equal or smaller than the top item", so nothing is ever appended after the end.
ENDED_LAST_ID: Final = "18446744073709551615-0"
# The field naming the run whose events an entry holds (absent: no run's).
RUN_FIELD: Final = "r"
# The one field of a tail entry: the batch's records, one after another.
TAIL_FIELD: Final = "b"
# A record's head: its job id's length; after the id, its last seq, 1 if the events end the
# job (else 0), and its events array's length; then the array. Big-endian, as Lua's
# ``struct.unpack`` in the worker's scripts reads them.
_ID_HEAD: Final = struct.Struct(">H")
_REST_HEAD: Final = struct.Struct(">IBI")
# The job record's field (``Keyspace.job_record``) holding ``protocol.request_digest`` of the
# request the job id belongs to: set by the first sender, kept after the job ends (the
# prompt is not), so a retry attaches to the job and a different request is refused.
DIGEST_FIELD: Final = "digest"
# The job record's field set when the job's message was pushed onto a queue (by the same
# script): a record with a digest but neither this nor a ``state`` was reserved by a send
# that never got onto the queue (Redis refused the push, and giving the id back too), so
# a retry of the same request pushes it instead of waiting on a job no worker will see.
ENQUEUED_FIELD: Final = "enqueued"
# The job record's field set when a live worker gave back a message that a dead worker had
# taken before its queue deadline and never claimed: the job was picked up in time, so its
# next pickup is not refused for the wait the death added.
PICKED_FIELD: Final = "picked"
# The job record's field holding the message admission pushed, until the job is claimed:
# the copy the watch pushes again when that message was lost on its way to a worker
# (``Keyspace.fresh_jobs``), and how many times the watch looked for it (its backoff).
MESSAGE_FIELD: Final = "message"
MESSAGE_CHECKS_FIELD: Final = "message_checks"
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
    # The write found the log already ended: nothing written (nothing ever follows the end).
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


def tail_record(job_id: str, last_seq: int, events: bytes, *, ended: bool) -> bytes:
    """One job's part of a tail entry (``events`` from ``pack_events``); a batch's entry
    is its jobs' records joined."""
    name = job_id.encode()
    return b"".join((_ID_HEAD.pack(len(name)), name,
                     _REST_HEAD.pack(last_seq, 1 if ended else 0, len(events)), events))


def tail_records(blob: bytes) -> Iterator[tuple[str, int, bool, bytes]]:
    """The ``(job id, last seq, ended, events array)`` of each record of a tail entry;
    raises ``ValueError`` where the blob is cut short or a job id is not UTF-8."""
    view = memoryview(blob)
    at = 0
    while at < len(view):
        try:
            (length,) = _ID_HEAD.unpack_from(view, at)
            at += _ID_HEAD.size
            job_id = bytes(view[at:at + length]).decode()
            at += length
            last_seq, ended, size = _REST_HEAD.unpack_from(view, at)
        except struct.error as exc:  # not a ValueError
            raise ValueError(f"tail record cut short: {exc}") from exc
        at += _REST_HEAD.size
        if at + size > len(view):
            raise ValueError("tail record cut short")
        yield job_id, last_seq, bool(ended), bytes(view[at:at + size])
        at += size


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


def entry_run(fields: Mapping[Any, Any] | None) -> str:
    """The run an entry's events were written by ('' when it names none), from its
    fields as redis-py's ``XRANGE`` gives them."""
    if not fields:
        return ""
    value = fields.get(RUN_FIELD.encode(), fields.get(RUN_FIELD))
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def add_entry(client: Any, job_log: str, last_seq: int, events: bytes, *,
              terminal: bool = False, run: str = "") -> Any:
    """``XADD`` one entry (``events`` from ``pack_events``, the last of them ``last_seq``;
    ``run``: the run that wrote them) as the format requires, on any redis-py client or
    pipeline (sync or async: the call's result is returned as is, to be awaited where it
    must)."""
    fields: dict[str, bytes] = {EVENT_FIELD: events}
    if terminal:
        fields[TERMINAL_FIELD] = b"1"
    if run:
        fields[RUN_FIELD] = run.encode()
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
    found, _more = await read_some_after(client, keys, job_id, after_seq, page=page)
    return found


async def read_some_after(client: Any, keys: Keyspace, job_id: str, after_seq: int, *,
                          page: int, max_pages: int | None = None,
                          run: PipelineRun = plain_run,
                          ) -> tuple[list[msgspec.Raw], bool]:
    """``read_after``, reading at most ``max_pages`` pages of the log (None: all of it):
    the events, and whether the log holds more past them (then the tail was not read:
    read again after the last seq returned). A reader that takes the events a page at a
    time holds one page of a long log, never the whole of it. Each read is a pipeline
    that ``run`` executes (a stream's judges it by its server, ``kvrelay.judged_read``)."""
    found: list[msgspec.Raw] = []
    job_log = keys.event_log(job_id)
    start = first_id_after(after_seq)
    newest = after_seq
    pages = 0
    while True:
        entries: list[Any] = (await _read(client, run, "xrange", job_log, min=start,
                                          max="+", count=page)) or []
        pages += 1
        for entry, fields in entries:
            data = entry_events(fields)
            if data is not None:
                found.extend(_split(data))
            newest = max(newest, seq_of_entry_id(entry))
            if TERMINAL_FIELD.encode() in fields or TERMINAL_FIELD in fields:
                return found, False
        if len(entries) < page:
            break
        if max_pages is not None and pages >= max_pages:
            return found, True
        start = first_id_after(seq_of_entry_id(entries[-1][0]))
    owner = await _read(client, run, "hget", keys.job_record(job_id), OWNER_FIELD)
    if not owner:
        return found, False
    newest_first: list[Any] = (await _read(client, run, "xrevrange",
                                           keys.worker_tail(owner.decode()),
                                           count=TAIL_READ_ENTRIES)) or []
    for _entry, fields in reversed(newest_first):
        blob = fields.get(TAIL_FIELD.encode())
        if not blob:
            continue
        try:
            for record_job, last_seq, _ended, events in tail_records(bytes(blob)):
                if record_job == job_id and last_seq > newest:
                    newest = last_seq
                    found.extend(_split(events))
        except ValueError:
            continue  # a damaged entry: what it held is read as missing (a gap)
    return found, False


async def _read(client: Any, run: PipelineRun, command: str, *args: Any, **kwargs: Any) -> Any:
    """One read command's reply, sent as a pipeline that ``run`` executes."""
    pipe = client.pipeline(transaction=False)
    getattr(pipe, command)(*args, **kwargs)
    (reply,) = await run(pipe)
    return reply
