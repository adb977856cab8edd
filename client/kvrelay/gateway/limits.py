"""What one HTTP request may cost the gateway: bytes, seconds, connections, buffered output.

Every bound has a default that serves OpenAI-style traffic and refuses abuse, and can be
changed in the ``[limits]`` table of the gateway's config file (docs/gateway.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

_MIB = 1 << 20


@dataclass(frozen=True)
class RequestLimits:
    """Args:
    max_body_bytes: a request body larger than this is refused (413) while it is read,
        before it is held in memory (a declared Content-Length at once).
    body_timeout: seconds a request's whole body may take to arrive (else 408).
    head_timeout: seconds from a connection's first byte (or a keep-alive request's
        first byte) until its request line and headers are in (else 408, closed).
    max_head_bytes: request line plus headers, at most (else 431, closed).
    max_json_depth: arrays and objects nested deeper than this are refused (400) before
        the body is parsed.
    max_connections: connections (and requests in flight) the server takes at once;
        uvicorn answers 503 past it.
    keep_alive_timeout: seconds an idle keep-alive connection is kept open.
    send_timeout: seconds one write to a streaming caller may wait for the caller to
        read; a caller that reads no faster is cut off and its job cancelled.
    socket_send_buffer_bytes: each connection's kernel send buffer (``SO_SNDBUF``; the
        kernel doubles it), instead of Linux's autotuning, which grows it to megabytes
        for a caller that stops reading. Raise it for fast, distant callers.
    stream_buffer_bytes: a stream's events waiting for their reader, at most; past
        it the stream fails (``SlowReader``) and its job is cancelled.
    max_output_entries: a request's ``n x max_tokens x (1 + logprobs)`` at most: the
        most token entries one answer can hold in the gateway's memory (refused at
        admission with 400).
    """

    max_body_bytes: int = 4 * _MIB
    body_timeout: float = 30.0
    head_timeout: float = 10.0
    max_head_bytes: int = 16 << 10
    max_json_depth: int = 32
    max_connections: int = 1024
    keep_alive_timeout: int = 5
    send_timeout: float = 30.0
    socket_send_buffer_bytes: int = 256 << 10
    stream_buffer_bytes: int = 4 * _MIB
    max_output_entries: int = 1 << 21

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"limits.{item.name} must be a number, got {value!r}")
            if item.type == "int" and not isinstance(value, int):
                raise ValueError(f"limits.{item.name} must be a whole number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"limits.{item.name} must be a finite number > 0, "
                                 f"got {value!r}")

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> RequestLimits:
        """The ``[limits]`` table of a config file (unknown names refused by name)."""
        known = {item.name: item.type for item in fields(cls)}
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(f"[limits]: unknown setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)}")
        values: dict[str, Any] = {
            name: float(value) if known[name] == "float" and isinstance(value, int)
            and not isinstance(value, bool) else value for name, value in table.items()}
        return cls(**values)
