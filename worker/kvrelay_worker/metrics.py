"""Prometheus metrics for one worker, on their own registry (so tests can make many)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 120.0)


class WorkerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("kvrelay_time_to_first_token_seconds",
                              "Enqueue to first token visible to the client", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.itl = Histogram("kvrelay_inter_token_latency_seconds",
                             "Time between a job's consecutive token events", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.e2e = Histogram("kvrelay_e2e_latency_seconds", "Enqueue to job end", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.queue_time = Histogram("kvrelay_queue_time_seconds", "Enqueue to pickup",
                                    registry=r, buckets=_LATENCY_BUCKETS)
        self.jobs = Counter("kvrelay_jobs", "Jobs by outcome", ["outcome"], registry=r)
        self.generated_tokens = Counter("kvrelay_generated_tokens", "Output tokens", registry=r)
        self.prompt_tokens = Counter("kvrelay_prompt_tokens", "Prompt tokens", registry=r)
        self.running = Gauge("kvrelay_running_sequences", "Sequences in the running batch",
                             registry=r)
        self.waiting = Gauge("kvrelay_waiting_sequences", "Sequences waiting to run",
                             registry=r)
        self.kv_usage = Gauge("kvrelay_kv_cache_usage_ratio", "Share of KV blocks in use",
                              registry=r)
        self.free_blocks = Gauge("kvrelay_kv_free_blocks", "Free KV blocks", registry=r)
        self.total_blocks = Gauge("kvrelay_kv_total_blocks", "KV blocks in the pool",
                                  registry=r)
        self.prefix_hit_rate = Gauge("kvrelay_prefix_cache_hit_rate",
                                     "Prompt tokens served from the prefix cache / queried",
                                     registry=r)
        self.preemptions = Gauge("kvrelay_preemptions", "Preemptions since start", registry=r)
        self.max_batch = Gauge("kvrelay_max_batch_size", "Largest batch so far", registry=r)
        self.info = Gauge("kvrelay_worker_info", "Constant 1, labelled with the model",
                          ["model"], registry=r)
        self.info.labels(model=model).set(1)

    def update_engine(self, stats: dict[str, Any]) -> None:
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        self.kv_usage.set(stats.get("kv_usage", 0.0))
        self.free_blocks.set(stats.get("free_blocks", 0))
        self.total_blocks.set(stats.get("total_blocks", 0))
        self.prefix_hit_rate.set(stats.get("prefix_cache_hit_rate", 0.0))
        self.preemptions.set(stats.get("preemptions", 0))
        self.max_batch.set(stats.get("max_batch_size", 0))

    def serve(self, port: int) -> int:
        """Start the HTTP endpoint; returns the bound port (0 picks a free one)."""
        server, _ = start_http_server(port, registry=self.registry)
        return int(server.server_port)
