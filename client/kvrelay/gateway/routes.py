"""The endpoints: /v1/models, /v1/chat/completions, /v1/completions, job cancel, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvrelay.client import AsyncClient
from kvrelay.completion import Completion
from kvrelay.errors import KvrelayError
from kvrelay.gateway import auth
from kvrelay.gateway.adapter_routes import ModelRouter, model_list
from kvrelay.gateway.body import check_json_depth, read_body
from kvrelay.gateway.disconnect import run_until_disconnect
from kvrelay.gateway.errors import GatewayError, from_kvrelay, internal_error, new_request_id
from kvrelay.gateway.health import HealthCheck
from kvrelay.gateway.metrics import GatewayMetrics
from kvrelay.gateway.output_budget import check_output_budget
from kvrelay.gateway.requests import ChatRequest, CompletionRequest, decode
from kvrelay.gateway.responses import CHAT, TEXT, ChunkMaker, whole
from kvrelay.gateway.settings import GatewaySettings
from kvrelay.gateway.sse import (
    DONE,
    CallerTooSlow,
    EventStreamResponse,
    Send,
    frame,
    parse_last_event_id,
)
from kvrelay.gateway.tenant_policy import quota_of
from kvrelay.stream import AsyncStream

log = logging.getLogger("kvrelay.gateway")


class Gateway:
    """What every endpoint shares: the SDK clients (one per namespace), settings, keys and
    metrics."""

    def __init__(self, clients: Mapping[str, AsyncClient], settings: GatewaySettings,
                 metrics: GatewayMetrics) -> None:
        self.clients = clients
        self.settings = settings
        self.metrics = metrics
        self.auth = auth.Authenticator(settings.api_keys)
        self.healthy = HealthCheck(self._ping_all)
        # A ``model`` that names a LoRA adapter -> its base model and the adapter.
        self.router = ModelRouter()

    # ------------------------------------------------------------------ helpers

    def client_of(self, tenant: str) -> AsyncClient:
        """The SDK client of the tenant's namespace: its jobs, logs and workers only."""
        return self.clients[self.settings.namespace_of(tenant)]

    def new_job(self, client: AsyncClient, tenant: str, model: str,
                options: dict[str, Any]) -> AsyncStream:
        """A stream for a new job of ``tenant`` (not started): its id, cache salt, timeout,
        priority cap and job quota are the tenant's."""
        policy = self.settings.policies.of(tenant)
        if "priority" in options:
            options["priority"] = policy.clamp(options["priority"])
        options.update(model=model, job_id=auth.new_job_id(tenant),
                       cache_salt=auth.cache_salt(tenant), timeout=self.settings.job_timeout)
        stream = client.stream(**options)
        if policy.counts_jobs:
            stream.set_quota(quota_of(tenant, policy))
        return stream

    async def routed_job(self, client: AsyncClient, tenant: str, model: str,
                         options: dict[str, Any]) -> AsyncStream:
        """``new_job`` for a ``model`` that may name a LoRA adapter: then the job goes to
        its base model's queue with ``lora`` set (docs/adapters.md)."""
        base, lora = await self.router.route(client, self.settings.namespace_of(tenant), model)
        if lora is not None:
            options["lora"] = lora
        return self.new_job(client, tenant, base, options)

    async def sdk_error(self, exc: KvrelayError, client: AsyncClient) -> GatewayError:
        any_worker = True
        if exc.code == "unknown_model":
            with contextlib.suppress(KvrelayError):
                any_worker = bool(await client.workers())
        error = from_kvrelay(exc, retry_after=self.settings.retry_after, any_worker=any_worker)
        if error.status == 500:
            return self.internal(f"{type(exc).__name__} ({exc.code}): {exc}")
        return error

    def internal(self, detail: str, exc: BaseException | None = None) -> GatewayError:
        """A 500 whose details go to the log under a request id, not to the caller."""
        request_id = new_request_id()
        log.error("gateway: internal error, request id %s: %s", request_id, detail,
                  exc_info=exc)
        return internal_error(request_id)

    def answer(self, route: str, response: Response) -> Response:
        self.metrics.count(route, response.status_code)
        return response

    def refuse(self, route: str, error: GatewayError) -> Response:
        self.metrics.count(route, error.status)
        return Response(error.json(), status_code=error.status, headers=error.headers,
                        media_type="application/json")

    # ------------------------------------------------------------------ endpoints

    async def models(self, request: Request) -> Response:
        try:
            client = self.client_of(self.auth.tenant(request.headers.get("authorization")))
            workers = await client.workers()
        except GatewayError as exc:
            return self.refuse("models", exc)
        except KvrelayError as exc:
            return self.refuse("models", await self.sdk_error(exc, client))
        data = model_list(workers)  # the served models, then each adapter with its parent
        return self.answer("models", JSONResponse({"object": "list", "data": data}))

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, TEXT)

    async def cancel(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            tenant = self.auth.tenant(request.headers.get("authorization"))
            if not auth.owns(tenant, job_id):
                raise GatewayError(404, f"no job {job_id!r}", code="job_not_found")
            client = self.client_of(tenant)
            await client.cancel(job_id)
        except GatewayError as exc:
            return self.refuse("cancel", exc)
        except KvrelayError as exc:
            return self.refuse("cancel", await self.sdk_error(exc, client))
        return self.answer("cancel", JSONResponse({"id": job_id, "cancelled": True}))

    async def health(self, request: Request) -> Response:
        if await self.healthy.ok():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    async def _ping_all(self) -> None:
        for client in self.clients.values():
            await client.ping()

    async def metrics_text(self, request: Request) -> Response:
        return Response(await self.metrics.scrape(), media_type=self.metrics.content_type)

    # ------------------------------------------------------------------ generation

    async def _generate(self, request: Request, kind: str) -> Response:
        route = "chat" if kind == CHAT else "completions"
        received = time.perf_counter()
        client = self.clients[self.settings.namespace]
        try:
            tenant = self.auth.tenant(request.headers.get("authorization"))
            client = self.client_of(tenant)
            raw = await read_body(request, self.settings.limits)
            check_json_depth(raw, self.settings.limits.max_json_depth)
            body: Any = decode(raw, ChatRequest if kind == CHAT else CompletionRequest)
            created = int(time.time())
            resume_from = request.headers.get("last-event-id")
            form = body.output_form(resumed=bool(resume_from))
            if resume_from:
                stream = await self._resume(client, tenant, resume_from)
            else:
                options = body.options()
                if not body.stream:
                    check_output_budget(options, self.settings.limits.max_output_entries)
                stream = await self.routed_job(client, tenant, body.model, options)
                if body.stream:
                    stream.discard_output()  # each chunk is forwarded, never held
                    await stream.start()
        except GatewayError as exc:
            return self.refuse(route, exc)
        except KvrelayError as exc:
            return self.refuse(route, await self.sdk_error(exc, client))
        maker = ChunkMaker(form, stream.job_id, body.model, created)
        if body.stream or resume_from:
            self.metrics.count(route, 200)
            return EventStreamResponse(
                lambda send: self._pump(client, stream, maker, send, body.resumable, received),
                send_timeout=self.settings.limits.send_timeout)
        try:
            done = await self._until_disconnected(request, stream, body.resumable)
        except KvrelayError as exc:
            return self.refuse(route, await self.sdk_error(exc, client))
        if done is None:
            return self.answer(route, Response(status_code=499))
        return self.answer(route, JSONResponse(whole(form, done, body.model, created)))

    async def _resume(self, client: AsyncClient, tenant: str,
                      last_event_id: str) -> AsyncStream:
        job_id, seq = parse_last_event_id(last_event_id)
        if not auth.owns(tenant, job_id):
            raise GatewayError(404, f"no job {job_id!r} to resume", code="job_not_found")
        # The gateway owns the caller's job either way: leaving aborts it unless the
        # request is resumable (then ``_pump`` detaches the stream first).
        return await client.resume(job_id, after_seq=seq, abort_on_exit=True,
                                   stream_timeout=self.settings.stream_timeout,
                                   keep_output=False)

    async def _until_disconnected(self, request: Request, stream: AsyncStream,
                                  keep: bool) -> Completion | None:
        """The completion, or None if the caller left first (the job is then aborted)."""

        async def run() -> Completion:
            async with stream:
                return await stream.final()

        job = await run_until_disconnect(run(), request.receive)
        if not job.done():
            if keep:
                stream.detach()
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError, KvrelayError):
                await job
            return None
        return job.result()

    async def _pump(self, client: AsyncClient, stream: AsyncStream, maker: ChunkMaker,
                    send: Send, keep: bool, received: float) -> None:
        """Write a job's events as SSE until it ends, fails, or the caller leaves."""
        job_id = stream.job_id
        metrics = self.metrics
        metrics.open_streams.inc()
        first = True
        try:
            async with stream:
                try:
                    async for chunk in stream:
                        await send(frame(maker.tokens(chunk), job_id=job_id, seq=chunk.seq))
                        metrics.streamed_chunks.inc()
                        if first:
                            first = False
                            metrics.ttft.observe(time.perf_counter() - received)
                    done = await stream.final()
                except (asyncio.CancelledError, CallerTooSlow):
                    if keep:
                        stream.detach()
                    raise
                except KvrelayError as exc:
                    error = await self.sdk_error(exc, client)
                    await send(frame(error.body(), job_id=job_id, seq=stream.last_seq))
                    return
            await send(frame(maker.finish(done), job_id=job_id, seq=stream.last_seq))
            await send(frame(DONE, job_id=job_id, seq=stream.last_seq))
        finally:
            metrics.open_streams.dec()
