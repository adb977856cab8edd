"""The sentinels' view as one worker's proxy shows it: every Redis server's address in a
sentinel's reply is rewritten to the worker's own listener for that server.

Sentinels hand out the real addresses of the primary and its replicas (``SENTINEL
MASTERS``, ``SENTINEL MASTER``, ``SENTINEL REPLICAS``, ``GET-MASTER-ADDR-BY-NAME``, the
``+switch-master`` messages). A worker that connected to those would go round its proxy,
so the proxy rewrites each reply: a bulk or simple string that is a server's port, or
holds ``127.0.0.1:<port>`` / ``127.0.0.1 <port>``, names the worker's listener instead.
The worker then compares the sentinels' primary with its connections' addresses
consistently, as it would without the proxy, and every connection it makes to a Redis
server goes through a listener that a fault can cut, blackhole or slow down.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

HOST = b"127.0.0.1"
# RESP types whose line is followed by that many bytes and a CRLF.
_SIZED = (b"$", b"=", b"!")
_ADDRESS = re.compile(rb"(127\.0\.0\.1[: ])(\d+)")


class ReplyRewriter:
    """Rewrites a stream of RESP replies chunk by chunk (``feed``); an element split over
    chunks waits for its end."""

    def __init__(self, ports: Mapping[int, int]) -> None:
        self._ports = {str(real).encode(): str(ours).encode() for real, ours in ports.items()}
        self._buffer = bytearray()

    def rewrite(self, text: bytes) -> bytes:
        """``text`` with every server port (alone or after the host) mapped."""
        if text in self._ports:
            return self._ports[text]
        return _ADDRESS.sub(lambda m: m.group(1) + self._ports.get(m.group(2), m.group(2)),
                            text)

    def feed(self, data: bytes) -> bytes:
        """The complete elements so far, rewritten; the rest is kept for the next chunk."""
        self._buffer += data
        out = bytearray()
        while self._take(out):
            pass
        return bytes(out)

    def _take(self, out: bytearray) -> bool:
        """Move one complete element (one line, or a sized string) from the buffer to
        ``out``; False when the buffer holds no complete element."""
        buffer = self._buffer
        end = buffer.find(b"\r\n")
        if end < 0:
            return False
        kind = bytes(buffer[:1])
        if kind in _SIZED:
            length = int(buffer[1:end])
            if length < 0:  # a null bulk string: the line alone
                out += buffer[:end + 2]
                del buffer[:end + 2]
                return True
            total = end + 2 + length + 2
            if len(buffer) < total:
                return False
            body = bytes(buffer[end + 2:end + 2 + length])
            if kind == b"$":
                body = self.rewrite(body)
            out += kind + str(len(body)).encode() + b"\r\n" + body + b"\r\n"
            del buffer[:total]
            return True
        line = bytes(buffer[1:end])
        if kind == b"+":
            line = self.rewrite(line)
        out += kind + line + b"\r\n"
        del buffer[:end + 2]
        return True
