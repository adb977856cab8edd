"""Serve the gateway with uvicorn (``kvrelay gateway``), under the settings' limits."""

from __future__ import annotations

import uvicorn

from kvrelay.gateway.app import create_app
from kvrelay.gateway.http_protocol import bounded_protocol
from kvrelay.gateway.settings import GatewaySettings


def serve(settings: GatewaySettings, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning") -> None:
    """Run until interrupted; one process, one event loop, one SDK client per namespace.

    uvicorn's own bounds are used where it has them (connections, keep-alive); the
    request head's deadline and size come from ``bounded_protocol``."""
    limits = settings.limits
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level,
                access_log=False, timeout_graceful_shutdown=5,
                http=bounded_protocol(limits.head_timeout, limits.max_head_bytes,
                                      limits.socket_send_buffer_bytes),
                limit_concurrency=limits.max_connections,
                timeout_keep_alive=limits.keep_alive_timeout)
