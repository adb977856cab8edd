"""Serve the gateway with uvicorn (``kvrelay gateway``)."""

from __future__ import annotations

import uvicorn

from kvrelay.gateway.app import create_app
from kvrelay.gateway.settings import GatewaySettings


def serve(settings: GatewaySettings, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning") -> None:
    """Run until interrupted; one process, one event loop, one SDK client."""
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level,
                access_log=False, timeout_graceful_shutdown=5)
