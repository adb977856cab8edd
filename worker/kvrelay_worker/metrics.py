"""Prometheus metrics for one worker, on their own registry (so tests can make many)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvrelay_worker.http_endpoints import serve_endpoints
from kvrelay_worker.probes import WorkerProbes
from kvrelay_worker.vllm_metrics import VllmMetrics

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
        self.info = Gauge("kvrelay_worker_info", "Constant 1, labelled with the model",
                          ["model"], registry=r)
        self.info.labels(model=model).set(1)
        # The same figures under vLLM's names, for the tools that read those (vllm_metrics).
        self.vllm = VllmMetrics(r, model)
        self.vllm.alias(r, (
            ("vllm:time_to_first_token_seconds", self.ttft, "Enqueue to the first token."),
            ("vllm:inter_token_latency_seconds", self.itl,
             "Time between a request's consecutive token events."),
            ("vllm:time_per_output_token_seconds", self.itl,
             "As vllm:inter_token_latency_seconds (the older name)."),
            ("vllm:prompt_tokens", self.prompt_tokens, "Prompt tokens of requests started."),
            ("vllm:generation_tokens", self.generated_tokens, "Tokens generated."),
        ))

    def watch_engine(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Export the engine's live state, read at scrape time (never stale)."""
        self.registry.register(_EngineStatsCollector(stats))
        self.vllm.watch_engine(self.registry, stats)

    def serve(self, port: int, host: str = "127.0.0.1",
              probes: WorkerProbes | None = None) -> int:
        """Start the HTTP endpoint on ``host`` (with ``/ready`` and ``/live`` when ``probes``
        is given); returns the bound port (0 picks a free one)."""
        return int(serve_endpoints(self.registry, port, host, probes).server_port)


# Engine stats exported as gauges: (metric name, stats key, help).
_ENGINE_GAUGES = (
    ("kvrelay_running_sequences", "running", "Sequences in the running batch"),
    ("kvrelay_waiting_sequences", "waiting", "Sequences waiting to run"),
    ("kvrelay_kv_cache_usage_ratio", "kv_usage", "Share of KV blocks in use"),
    ("kvrelay_kv_free_blocks", "free_blocks", "Free KV blocks"),
    ("kvrelay_kv_total_blocks", "total_blocks", "KV blocks in the pool"),
    ("kvrelay_prefix_cache_hit_rate", "prefix_cache_hit_rate",
     "Prompt tokens served from the prefix cache / prompt tokens looked up"),
    ("kvrelay_prefix_cache_hit_tokens", "prefix_cache_hits", "Prompt tokens served from cache"),
    ("kvrelay_prefix_cache_query_tokens", "prefix_cache_queries", "Prompt tokens looked up"),
    ("kvrelay_prefill_waits", "prefill_waits",
     "Steps a prompt waited for blocks another prompt was prefilling, since start"),
    ("kvrelay_preemptions", "preemptions", "Sequences preempted since start"),
    ("kvrelay_swaps_out", "swaps_out", "Preemptions by swap to host memory since start"),
    ("kvrelay_swaps_in", "swaps_in", "Swapped sequences resumed from host memory since start"),
    ("kvrelay_recomputes", "recomputes", "Preemptions by recompute since start"),
    ("kvrelay_swapped_sequences", "swapped", "Sequences whose KV waits in host memory"),
    ("kvrelay_swap_free_blocks", "free_swap_blocks", "Free blocks in the host swap pool"),
    ("kvrelay_max_batch_size", "max_batch_size", "Largest batch so far"),
    ("kvrelay_jobs_running", "jobs", "Jobs held by the engine"),
    # Speculative decoding (KVRELAY_SPECULATIVE); all 0 while it is off.
    ("kvrelay_spec_proposed_tokens", "spec_proposed_tokens",
     "Draft tokens proposed since start"),
    ("kvrelay_spec_accepted_tokens", "spec_accepted_tokens",
     "Draft tokens the model accepted since start"),
    ("kvrelay_spec_verify_steps", "spec_verify_steps",
     "Verifications since start: one per speculating sequence per step"),
    ("kvrelay_spec_acceptance_rate", "spec_acceptance_rate",
     "Accepted / proposed draft tokens since start"),
    ("kvrelay_spec_mean_accepted_length", "spec_mean_accepted_length",
     "Tokens emitted per verification (accepted drafts + 1), mean since start"),
)


class _EngineStatsCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self._stats()
        for name, key, doc in _ENGINE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=float(stats.get(key, 0) or 0))
