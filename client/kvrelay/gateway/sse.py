"""Server-Sent Events framing, and the ``Last-Event-ID`` that points back into a job.

Every event carries ``id: <job id>:<seq>``, the seq of the job event it came from, so a
client that reconnects with ``Last-Event-ID`` gets exactly what followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope
from starlette.types import Send as ASGISend

from kvrelay.gateway.disconnect import run_until_disconnect
from kvrelay.gateway.errors import bad_request

log = logging.getLogger("kvrelay.gateway")

DONE = b"[DONE]"
MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encoder = msgspec.json.Encoder()


def event_id(job_id: str, seq: int) -> str:
    return f"{job_id}:{seq}"


def frame(data: dict[str, Any] | bytes, *, job_id: str, seq: int) -> bytes:
    """One event: ``id: job:seq`` then one ``data:`` line (JSON never holds a newline)."""
    body = data if isinstance(data, bytes) else _encoder.encode(data)
    return b"id: " + event_id(job_id, seq).encode() + b"\ndata: " + body + b"\n\n"


def parse_last_event_id(value: str) -> tuple[str, int]:
    """``job:seq`` -> (job id, seq); a malformed header is a 400."""
    job_id, sep, seq = value.strip().rpartition(":")
    # seq -1 names "before the first event" (an error event sent before any other).
    if not sep or not job_id or not (seq.isdigit() or seq == "-1") or len(seq) > 18:
        raise bad_request(f"Last-Event-ID must be '<job id>:<seq>', got {value!r}")
    return job_id, int(seq)


Send = Callable[[bytes], Awaitable[None]]


class CallerTooSlow(Exception):
    """A write to the caller waited longer than the send timeout: the caller is not
    reading (uvicorn's ``send`` waits while the socket's buffers are full)."""


class EventStreamResponse(Response):
    """An ASGI response that runs ``produce(send)`` and cancels it when the client leaves.

    (Starlette's StreamingResponse leaves an abandoned generator to the garbage collector;
    here the producer is cancelled at once, so its ``finally`` aborts the job right away.)
    A write that waits more than ``send_timeout`` seconds raises ``CallerTooSlow`` in the
    producer, which ends it: the connection is then closed with the response unfinished.
    """

    media_type = MEDIA_TYPE

    def __init__(self, produce: Callable[[Send], Awaitable[None]], *,
                 send_timeout: float) -> None:
        self._produce = produce
        self._send_timeout = send_timeout
        self.status_code = 200
        self.background = None
        self.init_headers(HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: ASGISend) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        send_timeout = self._send_timeout

        async def write(data: bytes) -> None:
            try:
                async with asyncio.timeout(send_timeout):
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            except TimeoutError:
                raise CallerTooSlow(f"the caller read nothing for {send_timeout:g}s") from None

        async def produce() -> None:
            try:
                await self._produce(write)
            except CallerTooSlow as exc:
                log.warning("gateway: cut off a stream's caller: %s", exc)
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        producer = await run_until_disconnect(produce(), receive)
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
