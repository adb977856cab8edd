"""The worker's one HTTP port: Prometheus metrics, and the ``/ready`` and ``/live`` probes.

The probes answer 200 or 503 with a one-line reason (``probes.WorkerProbes``); every other
path serves the metrics, as the plain Prometheus endpoint did (``/metrics`` included). The
server starts before the model loads, so an orchestrator sees "not ready" during the load
rather than a refused connection it could not tell from a dead process.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from kvrelay_worker.probes import ProbeAnswer, WorkerProbes

READY_PATH = "/ready"
LIVE_PATH = "/live"

_StartResponse = Callable[..., Any]
_WsgiApp = Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # A probe or a scrape never holds up another; threads die with the process.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes arrive every few seconds: no access log."""


def endpoints_app(registry: CollectorRegistry, probes: WorkerProbes | None) -> _WsgiApp:
    """The WSGI app: probes on their paths (when given), metrics everywhere else."""
    metrics = make_wsgi_app(registry)
    routes: dict[str, Callable[[], ProbeAnswer]] = {}
    if probes is not None:
        routes = {READY_PATH: probes.ready, LIVE_PATH: probes.live}

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        probe = routes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics(environ, start_response)
        answer = probe()
        body = f"{answer.reason}\n".encode()
        start_response("200 OK" if answer.ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_endpoints(registry: CollectorRegistry, port: int, host: str,
                    probes: WorkerProbes | None = None) -> WSGIServer:
    """Serve on ``host``:``port`` (0: any free port) from a daemon thread."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    server_class = type("EndpointServer", (_ThreadingServer,), {"address_family": family})
    server: WSGIServer = make_server(str(address[0]), port, endpoints_app(registry, probes), server_class,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="kvrelay-http", daemon=True).start()
    return server
