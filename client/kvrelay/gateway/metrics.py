"""Prometheus metrics of one gateway process: requests by status, TTFT, open streams, and
the queue depth of every model, read from Redis when scraped (``kvrelay.queue_metrics``)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvrelay.client import AsyncClient
from kvrelay.queue_metrics import QueueDepthCollector

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """One registry per app (several apps can live in one process, e.g. in tests)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queues: Mapping[str, AsyncClient] | None = None) -> None:
        self.registry = CollectorRegistry()
        # The queues of each namespace's client (None: no queue gauges).
        self.queues = QueueDepthCollector(queues) if queues else None
        if self.queues is not None:
            self.registry.register(self.queues)
        self.requests = Counter("kvrelay_gateway_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("kvrelay_gateway_ttft_seconds",
                              "request received -> first token sent", buckets=_TTFT_BUCKETS,
                              registry=self.registry)
        self.open_streams = Gauge("kvrelay_gateway_open_streams", "SSE streams being served",
                                  registry=self.registry)
        self.streamed_chunks = Counter("kvrelay_gateway_streamed_chunks",
                                       "token chunks sent as SSE events", registry=self.registry)

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """The text of ``GET /metrics``: the queues read now, then everything rendered."""
        if self.queues is not None:
            await self.queues.refresh()
        return self.render()
