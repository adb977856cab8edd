"""A minimal HTTP server for ``kvrelay metrics``: ``GET /metrics`` answers the text of one
async render call, anything else 404; one request per connection.

Hand-rolled on asyncio so the queue reads run on the same loop as the SDK client (no
web framework needed: the exporter must run where the gateway's extra is not installed).
Each request is bounded: its head must arrive within ``_READ_S`` and fit ``_HEAD_LIMIT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("kvrelay.cli.metrics")

_READ_S = 10.0
_HEAD_LIMIT = 16 << 10

Render = Callable[[], Awaitable[bytes]]


def _response(status: str, body: bytes, content_type: str) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader, render: Render, content_type: str) -> bytes:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_S)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        return _response("400 Bad Request", b"bad request\n", "text/plain")
    method, _, rest = head.decode("latin-1").partition(" ")
    path = rest.partition(" ")[0].partition("?")[0]
    if path != "/metrics":
        return _response("404 Not Found", b"see /metrics\n", "text/plain")
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", b"GET only\n", "text/plain")
    body = await render()
    answer = _response("200 OK", body, content_type)
    return answer[: answer.index(b"\r\n\r\n") + 4] if method == "HEAD" else answer


async def serve_metrics(host: str, port: int, render: Render, content_type: str,
                        stop: asyncio.Event,
                        on_ready: Callable[[int], None] = lambda port: None) -> None:
    """Serve ``render`` at ``http://host:port/metrics`` until ``stop`` is set;
    ``on_ready`` gets the bound port (0 picks a free one)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await _answer(reader, render, content_type))
            await writer.drain()
        except Exception:  # one broken scrape must not end the exporter
            log.exception("kvrelay metrics: a scrape failed")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=_HEAD_LIMIT)
    async with server:
        on_ready(int(server.sockets[0].getsockname()[1]))
        await stop.wait()
