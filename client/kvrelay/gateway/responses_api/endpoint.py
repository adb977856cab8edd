"""``POST /v1/responses``: one job per request, answered whole or as Responses events.

Stateless: nothing is stored, so a request carries its whole conversation in ``input``
(``store: true``, ``previous_response_id`` and the ``/v1/responses/{id}`` routes are
refused). Streamed answers are Server-Sent Events with ``event:`` names and a
``sequence_number`` per event; they cannot be resumed (no ``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvrelay.client import AsyncClient
from kvrelay.completion import Completion
from kvrelay.errors import KvrelayError
from kvrelay.gateway.body import check_json_depth, read_body
from kvrelay.gateway.disconnect import run_until_disconnect
from kvrelay.gateway.errors import GatewayError, bad_request
from kvrelay.gateway.output_budget import check_output_budget
from kvrelay.gateway.responses_api.output_items import Event, OutputAssembler
from kvrelay.gateway.responses_api.request import ResponsesRequest, parse_request
from kvrelay.gateway.responses_api.response_object import (
    error_body,
    response_body,
    status_of,
    usage_body,
)
from kvrelay.gateway.routes import Gateway
from kvrelay.gateway.sse import EventStreamResponse, Send
from kvrelay.stream import AsyncStream

ROUTE = "responses"
_encoder = msgspec.json.Encoder()


class EventWriter:
    """Writes Responses events: ``event: <type>`` and the JSON with its sequence number."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.sequence_number = 0

    async def __call__(self, event: Event) -> None:
        kind: str = event["type"]
        data = {"type": kind, "sequence_number": self.sequence_number, **event}
        self.sequence_number += 1
        await self._send(b"event: " + kind.encode() + b"\ndata: " + _encoder.encode(data)
                         + b"\n\n")


class ResponsesEndpoint:
    """The ``/v1/responses`` routes of one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def create(self, request: Request) -> Response:
        gateway = self.gateway
        received = time.perf_counter()
        client = gateway.clients[gateway.settings.namespace]
        try:
            tenant = gateway.auth.tenant(request.headers.get("authorization"))
            client = gateway.client_of(tenant)
            if request.headers.get("last-event-id"):
                raise bad_request("Last-Event-ID: /v1/responses streams cannot be resumed")
            raw = await read_body(request, gateway.settings.limits)
            check_json_depth(raw, gateway.settings.limits.max_json_depth)
            body = parse_request(raw)
            if not body.stream:
                check_output_budget(body.options, gateway.settings.limits.max_output_entries)
            stream = await gateway.routed_job(client, tenant, body.model, body.options)
            stream.discard_output()  # the assembler keeps what the answer needs
            if body.stream:
                await stream.start()
        except GatewayError as exc:
            return gateway.refuse(ROUTE, exc)
        except KvrelayError as exc:
            return gateway.refuse(ROUTE, await gateway.sdk_error(exc, client))
        answer = _Answer(body, stream.job_id, int(time.time()))
        if body.stream:
            gateway.metrics.count(ROUTE, 200)
            return EventStreamResponse(
                lambda send: self._pump(client, stream, answer, send, received),
                send_timeout=gateway.settings.limits.send_timeout)
        try:
            done = await _run_whole(request, stream, answer.assembler)
        except KvrelayError as exc:
            return gateway.refuse(ROUTE, await gateway.sdk_error(exc, client))
        if done is None:
            return gateway.answer(ROUTE, Response(status_code=499))
        answer.assembler.close(status_of(done.finish_reason))
        return gateway.answer(ROUTE, JSONResponse(answer.finished(done)))

    async def not_stored(self, request: Request) -> Response:
        """``GET``/``DELETE /v1/responses/{id}`` and its sub-routes: nothing is stored."""
        error = GatewayError(404, "kvrelay stores no responses: /v1/responses is stateless",
                             code="response_not_found")
        return self.gateway.refuse(ROUTE, error)

    async def _pump(self, client: AsyncClient, stream: AsyncStream, answer: _Answer,
                    send: Send, received: float) -> None:
        """Write the job as Responses events until it ends, fails, or the caller leaves."""
        metrics = self.gateway.metrics
        write = EventWriter(send)
        assembler = answer.assembler
        metrics.open_streams.inc()
        try:
            async with stream:
                await write({"type": "response.created", "response": answer.in_progress()})
                await write({"type": "response.in_progress", "response": answer.in_progress()})
                first = True
                try:
                    async for chunk in stream:
                        if chunk.index != 0:
                            continue
                        for event in assembler.add(chunk):
                            await write(event)
                        metrics.streamed_chunks.inc()
                        if first:
                            first = False
                            metrics.ttft.observe(time.perf_counter() - received)
                    done = await stream.final()
                except KvrelayError as exc:
                    error = await self.gateway.sdk_error(exc, client)
                    await write({"type": "response.failed", "response": answer.failed(error)})
                    return
            for event in assembler.close(status_of(done.finish_reason)):
                await write(event)
            finished = answer.finished(done)
            kind = "response.completed" if finished["status"] == "completed" \
                else "response.incomplete"
            await write({"type": kind, "response": finished})
        finally:
            metrics.open_streams.dec()


class _Answer:
    """One request's Response objects at each stage."""

    def __init__(self, body: ResponsesRequest, job_id: str, created_at: int) -> None:
        self.body = body
        self.job_id = job_id
        self.created_at = created_at
        self.assembler = OutputAssembler(job_id, logprobs=body.logprobs)

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_body(job_id=self.job_id, model=self.body.model,
                             created_at=self.created_at, echo=self.body.echo, status=status,
                             **extra)

    def in_progress(self) -> dict[str, Any]:
        return self._response("in_progress")

    def failed(self, error: GatewayError) -> dict[str, Any]:
        return self._response("failed", output=self.assembler.output, error=error_body(error))

    def finished(self, done: Completion) -> dict[str, Any]:
        return self._response(status_of(done.finish_reason), output=self.assembler.output,
                              usage=usage_body(done.usage, self.assembler.reasoning_tokens))


async def _run_whole(request: Request, stream: AsyncStream,
                     assembler: OutputAssembler) -> Completion | None:
    """The finished job (its chunks fed to ``assembler``), or None if the caller left
    first (the job is then aborted)."""

    async def run() -> Completion:
        async with stream:
            async for chunk in stream:
                if chunk.index == 0:
                    assembler.add(chunk)
            return await stream.final()

    job = await run_until_disconnect(run(), request.receive)
    if not job.done():
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, KvrelayError):
            await job
        return None
    return job.result()
