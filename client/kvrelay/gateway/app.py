"""``create_app(settings)``: the ASGI application (Starlette), one SDK client per namespace
the gateway serves (most run one: the default namespace)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kvrelay.client import AsyncClient
from kvrelay.errors import KvrelayError
from kvrelay.gateway.adapter_routes import AdapterAdminRoutes
from kvrelay.gateway.metrics import GatewayMetrics
from kvrelay.gateway.responses_api import ResponsesEndpoint
from kvrelay.gateway.routes import Gateway
from kvrelay.gateway.settings import GatewaySettings
from kvrelay.gateway.trace_headers import TraceHeaders
from kvrelay.tracing import switch as tracing

log = logging.getLogger("kvrelay.gateway")


def create_app(settings: GatewaySettings | None = None) -> Starlette:
    """The gateway app; its SDK client connects when the server starts (lifespan)."""
    settings = settings or GatewaySettings.from_env()
    log.info("gateway tracing: %s", tracing.configure("kvrelay-gateway"))
    clients = {namespace: AsyncClient(settings.redis_url, namespace=namespace,
                                      stream_timeout=settings.stream_timeout,
                                      reconnect_timeout=settings.reconnect_timeout,
                                      max_queue=settings.max_queue,
                                      stream_buffer_bytes=settings.limits.stream_buffer_bytes)
               for namespace in settings.namespaces}
    gateway = Gateway(clients, settings, GatewayMetrics(queues=clients))
    responses = ResponsesEndpoint(gateway)
    admin = AdapterAdminRoutes(clients, settings, gateway.answer, gateway.refuse)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for client in clients.values():
            try:
                await client.connect()
            except KvrelayError as exc:  # serve anyway: requests get 503 until Redis is back
                log.warning("gateway: %s", exc)
        try:
            yield
        finally:
            for client in clients.values():
                await client.aclose()

    routes = [
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/v1/chat/completions", gateway.chat, methods=["POST"]),
        Route("/v1/completions", gateway.completions, methods=["POST"]),
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{rest:path}", responses.not_stored,
              methods=["GET", "POST", "DELETE"]),
        Route("/v1/jobs/{job_id}/cancel", gateway.cancel, methods=["POST"]),
        Route("/v1/admin/adapters", admin.list, methods=["GET"]),
        Route("/v1/admin/adapters", admin.load, methods=["POST"]),
        Route("/v1/admin/adapters/{name:path}", admin.unload, methods=["DELETE"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/metrics", gateway.metrics_text, methods=["GET"]),
    ]
    async def unexpected(request: Request, exc: Exception) -> Response:
        error = gateway.internal(f"unexpected error on {request.url.path}", exc)
        return gateway.refuse("unexpected", error)

    # A caller's ``traceparent`` header: its job's spans continue the caller's trace.
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(TraceHeaders)],
                    exception_handlers={Exception: unexpected})
    app.state.gateway = gateway
    return app
