"""uvicorn's httptools protocol with two bounds on a request's head that uvicorn lacks.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) and how many
connections it takes (``limit_concurrency``), and those are used as they are. It has no
deadline for a request line and headers to arrive (its keep-alive timer is cancelled by
any byte, so one byte every few seconds holds a connection forever) and, with httptools,
no bound on their size. This subclass adds both through the parser's own callbacks: a
head that is not complete ``head_timeout`` seconds after its first byte gets 408, one
larger than ``max_head_bytes`` gets 431; either way the connection is closed.

It also fixes each connection's kernel send buffer: Linux grows an autotuned one to
megabytes for a caller that stops reading, which is that much more memory held and that
much longer before the gateway's writes stall and the caller is noticed (``send_timeout``).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kvrelay.gateway.errors import GatewayError

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


class _HeadRefused(httptools.HttpParserError):
    """Raised in a parser callback after the answer is written: the parser stops, and
    uvicorn (which catches parser errors) writes nothing more (``send_400_response``)."""


def bounded_protocol(head_timeout: float, max_head_bytes: int,
                     send_buffer_bytes: int | None = None) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these bounds;
    ``send_buffer_bytes`` fixes each connection's kernel send buffer (``SO_SNDBUF``)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0
        _refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and send_buffer_bytes:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            if self._head_timer is None:  # a keep-alive connection's next request
                self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._refused:
                super().send_400_response(msg)

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > max_head_bytes:
                self._refuse(431, f"the request line and headers exceed {max_head_bytes} "
                                  "bytes", "headers_too_large")
                raise _HeadRefused("head too large")

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(head_timeout, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            self._refuse(408, f"the request line and headers did not arrive within "
                              f"{head_timeout:g}s", "request_timeout")

        def _refuse(self, status: int, message: str, code: str) -> None:
            self._disarm()
            if self._refused or self.transport.is_closing():
                return
            self._refused = True
            if self.cycle is not None and not self.cycle.response_complete:
                # A pipelined head behind a response still being written: no answer can
                # be put between that response's bytes, so the connection just closes.
                self.transport.close()
                return
            body = GatewayError(status, message, code=code).json()
            head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                    "content-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            self.transport.write(head + body)
            self.transport.close()

    return BoundedHttpToolsProtocol
