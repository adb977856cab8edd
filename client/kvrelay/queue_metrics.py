"""The queue depths (``kvrelay.queue_depth``) as Prometheus gauges, read when scraped.

One collector serves the gateway's ``/metrics`` and ``kvrelay metrics`` alike. Its
``refresh`` reads every namespace (bounded: ``QueueDepthReader``), then the registry's
render reads what it stored; a namespace whose Redis does not answer within ``timeout``
reports ``kvrelay_queue_read_ok 0`` and no depths, so the scrape itself still answers.
Needs ``prometheus_client`` (the gateway's extra).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvrelay.client import AsyncClient
from kvrelay.errors import KvrelayError
from kvrelay.queue_depth import ModelQueue

__all__ = ["QUEUE_GAUGES", "QueueDepthCollector"]

log = logging.getLogger("kvrelay.queue_metrics")

# (name, help, the reading's figure), each labelled namespace and model.
QUEUE_GAUGES = (
    ("kvrelay_queue_depth", "Jobs waiting for the model: in its Redis queues and inside "
     "live workers' engines.", lambda q: q.depth),
    ("kvrelay_queue_in_redis", "Jobs in the model's Redis queues (shared and workers' own).",
     lambda q: q.queued),
    ("kvrelay_queue_in_engines", "Jobs live workers took that wait in their engines to run.",
     lambda q: q.engine_waiting),
    ("kvrelay_model_workers", "Live workers serving the model.", lambda q: q.workers),
)
_LABELS = ["namespace", "model"]


class QueueDepthCollector(Collector):
    """Per namespace and model, the queue gauges as of the latest ``refresh``."""

    def __init__(self, clients: Mapping[str, AsyncClient], models: Iterable[str] = (),
                 timeout: float = 2.0) -> None:
        self.clients = clients
        self.models = tuple(models)
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._readings: list[ModelQueue] = []
        self._ok: dict[str, bool] = {}
        self._errors: dict[str, str] = {}

    async def refresh(self) -> None:
        """Read every namespace's queues (one read at a time: the scans keep a cursor)."""
        async with self._lock:
            readings: list[ModelQueue] = []
            errors: dict[str, str] = {}
            for namespace, client in self.clients.items():
                try:
                    readings += await asyncio.wait_for(client.queue_depths(self.models),
                                                       self.timeout)
                except (KvrelayError, TimeoutError) as exc:
                    errors[namespace] = str(exc) or f"no answer within {self.timeout} s"
                    if namespace not in self._errors:  # said once, not at every scrape
                        log.info("queue depths of namespace %r not read: %s", namespace,
                                 errors[namespace])
            self._readings, self._errors = readings, errors
            self._ok = {namespace: namespace not in errors for namespace in self.clients}

    @property
    def ok(self) -> dict[str, bool]:
        """Per namespace, whether the latest ``refresh`` read its queues."""
        return dict(self._ok)

    @property
    def errors(self) -> dict[str, str]:
        """Per namespace the latest ``refresh`` could not read, why."""
        return dict(self._errors)

    def collect(self) -> Iterator[Metric]:
        readings, ok = self._readings, self._ok
        for name, doc, figure in QUEUE_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            for queue in readings:
                family.add_metric([queue.namespace, queue.model], float(figure(queue)))
            yield family
        read_ok = GaugeMetricFamily("kvrelay_queue_read_ok",
                                    "1 when the latest scrape read the namespace's queues.",
                                    labels=["namespace"])
        for namespace, fine in ok.items():
            read_ok.add_metric([namespace], 1.0 if fine else 0.0)
        yield read_ok
