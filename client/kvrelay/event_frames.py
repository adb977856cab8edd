"""How events travel packed: many events per log entry, many jobs per pub/sub message.

A worker writes one step's events of all its jobs at once, so Redis sees one message per
client and one tail entry per step instead of one of each per event. Three shapes, all
msgpack, all built by concatenating already-encoded events (nothing is decoded to be
re-encoded, and the worker's Lua scripts can splice them):

- **events**: an array of encoded events of one job, in ``seq`` order;
- **pair**: ``[job_id, events]``: one job's share of a message;
- **message**: an array of pairs: what one ``PUBLISH`` carries (a client's reply channel
  gets the pairs of all its jobs in a worker's batch; a job's own channel gets its pair).

Decoding leaves each job's events as ``msgspec.Raw`` until the stream that wants them
decodes them, so the one reader task routing a client's messages only splits them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

__all__ = [
    "array_header",
    "pack_events",
    "pack_message",
    "pack_pair",
    "unpack_events",
    "unpack_message",
]

_raw_list: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
_pairs: Final = msgspec.msgpack.Decoder(list[tuple[str, msgspec.Raw]])
_encoder: Final = msgspec.msgpack.Encoder()


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` items."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def pack_events(events: Sequence[bytes]) -> bytes:
    """An events array from encoded events (``protocol.encode_event``)."""
    return array_header(len(events)) + b"".join(events)


def unpack_events(data: bytes | bytearray | memoryview | msgspec.Raw) -> list[msgspec.Raw]:
    """Each encoded event of an events array (raises ``msgspec.DecodeError``)."""
    return _raw_list.decode(data)


def pack_pair(job_id: str, events: bytes) -> bytes:
    """One job's share of a message: ``[job_id, events]`` (``events`` from ``pack_events``)."""
    return b"\x92" + _encoder.encode(job_id) + events


def pack_message(pairs: Sequence[bytes]) -> bytes:
    """A pub/sub message from pairs (``pack_pair``)."""
    return array_header(len(pairs)) + b"".join(pairs)


def unpack_message(data: bytes) -> list[tuple[str, msgspec.Raw]]:
    """(job id, events array) per pair of a message (raises ``msgspec.DecodeError`` or
    ``msgspec.ValidationError`` for anything else)."""
    return _pairs.decode(data)
