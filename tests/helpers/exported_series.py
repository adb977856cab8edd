"""Every series a worker and a gateway export, with their labels: their metrics objects
as the processes build them, rendered as a scrape renders them (the gateway's queue gauges
read from a real Redis holding one queued job, so that they carry samples)."""

from __future__ import annotations

import redis

from helpers.prom_scrape import Scrape, parse
from kvrelay import AsyncClient
from kvrelay.keys import Keyspace


def worker_series() -> Scrape:
    """A worker's ``/metrics`` families (engine stats read as an idle engine reports them)."""
    from prometheus_client import generate_latest

    from kvrelay_worker.metrics import WorkerMetrics

    metrics = WorkerMetrics("m")
    metrics.watch_engine(dict)
    metrics.jobs.labels(outcome="finished").inc()
    return parse(generate_latest(metrics.registry).decode())


async def gateway_series(redis_url: str) -> Scrape:
    """A gateway's ``/metrics`` families, its queue gauges read from ``redis_url``."""
    from kvrelay.gateway.metrics import GatewayMetrics

    raw = redis.Redis.from_url(redis_url)
    try:
        raw.rpush(Keyspace().queue("m"), "job")
    finally:
        raw.close()
    client = AsyncClient(redis_url, require_worker=False)
    try:
        metrics = GatewayMetrics(queues={"": client})
        metrics.count("completions", 200)
        return parse((await metrics.scrape()).decode())
    finally:
        await client.aclose()


def sample_names(scraped: Scrape) -> dict[str, set[str]]:
    """Each sample name a query may use (``x_total``, ``x_bucket``...) -> its labels."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    names: dict[str, set[str]] = {}
    for family, kind in scraped.types.items():
        for suffix in suffixes.get(kind, ()):
            labels = set(scraped.labels.get(family, set()))
            names[family + suffix] = labels if suffix == "_bucket" else labels - {"le"}
    return names
