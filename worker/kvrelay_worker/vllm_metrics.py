"""The worker's metrics under vLLM's names (``vllm:*``, labelled ``model_name``), beside
kvrelay's own, so that dashboards, alerts and autoscalers written for vLLM read a kvrelay
fleet unchanged.

Three sources, none of them adding work per token:

- **Aliases.** What kvrelay already measures (TTFT, inter-token latency, prompt and
  generated tokens) is re-exported at scrape time under vLLM's name: one measurement, two
  names, so the two can never disagree and the token path pays nothing more.
- **Per request.** At a job's end on this worker (its terminal event written): its
  outcome by ``finished_reason``, end-to-end and queue time, prompt and generated token
  counts and its mean time per output token.
- **Engine state, read at scrape time.** Running, waiting and KV usage as gauges; the
  engine's running totals (preemptions, prefix-cache tokens, speculative drafts) as true
  counters, advanced by the growth of each total since the previous scrape, so they never
  go down even if the engine's own totals start again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvrelay.protocol import AnyEvent, ErrorCode, Failed, Finished

MODEL_LABEL = "model_name"
# vLLM's finish reasons (``finished_reason`` label), each exported from the start at 0.
FINISH_REASONS = ("stop", "length", "abort", "error")
# How a job that failed here counts: stopped on purpose is vLLM's "abort"; a request
# refused as it was (vLLM answers those 400 before its engine) is no request served at
# all; any other failure is an "error".
_ABORTED_CODES = frozenset({ErrorCode.CANCELLED, ErrorCode.DEADLINE_EXCEEDED,
                            ErrorCode.QUEUE_TIMEOUT})
_REFUSED_CODES = frozenset({ErrorCode.INVALID_REQUEST, ErrorCode.UNKNOWN_MODEL,
                            ErrorCode.PROMPT_TOO_LONG, ErrorCode.PAYLOAD_TOO_LARGE,
                            ErrorCode.PROTOCOL_VERSION, ErrorCode.JOB_ID_REUSED})

# Request latencies span milliseconds to hours (long generations queued behind others).
_REQUEST_SECONDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TOKEN_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                  0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

# Engine stats keys exported as vLLM gauges: (name, stats key, help).
ENGINE_GAUGES = (
    ("vllm:num_requests_running", "running", "Requests in the engine's running batch."),
    ("vllm:num_requests_waiting", "waiting",
     "Requests in the engine waiting to run (the Redis queue: kvrelay_queue_depth)."),
    ("vllm:kv_cache_usage_perc", "kv_usage", "Share of KV-cache blocks in use (0 to 1)."),
)
# Engine running totals exported as vLLM counters: (name without _total, stats key, help).
ENGINE_COUNTERS = (
    ("vllm:num_preemptions", "preemptions", "Sequences preempted (swapped or recomputed)."),
    ("vllm:prefix_cache_queries", "prefix_cache_queries",
     "Prompt tokens looked up in the prefix cache."),
    ("vllm:prefix_cache_hits", "prefix_cache_hits", "Prompt tokens served from the prefix cache."),
    ("vllm:spec_decode_num_drafts", "spec_verify_steps",
     "Speculative verifications: one per speculating sequence per step."),
    ("vllm:spec_decode_num_draft_tokens", "spec_proposed_tokens", "Draft tokens proposed."),
    ("vllm:spec_decode_num_accepted_tokens", "spec_accepted_tokens",
     "Draft tokens the model accepted."),
)


def finished_reason(event: AnyEvent) -> str | None:
    """vLLM's ``finished_reason`` of a job's terminal event (None: not a terminal event,
    or a refused request)."""
    if isinstance(event, Finished):
        reason = event.finish_reason
        return reason if reason in FINISH_REASONS else "stop"  # "tool_calls" stopped normally
    if isinstance(event, Failed) and event.code not in _REFUSED_CODES:
        return "abort" if event.code in _ABORTED_CODES else "error"
    return None


class VllmMetrics:
    """The ``vllm:*`` series of one worker, on the worker's registry."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        bound = {MODEL_LABEL: model}
        success = Counter("vllm:request_success", "Requests ended on this worker, by reason.",
                          [MODEL_LABEL, "finished_reason"], registry=registry)
        self._success = {reason: success.labels(model_name=model, finished_reason=reason)
                         for reason in FINISH_REASONS}

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, [MODEL_LABEL], registry=registry,
                             buckets=buckets).labels(**bound)

        self._e2e = histogram("vllm:e2e_request_latency_seconds",
                              "Enqueue to the job's end.", _REQUEST_SECONDS)
        self._queue = histogram("vllm:request_queue_time_seconds",
                                "Enqueue to pickup by this worker.", _REQUEST_SECONDS)
        token_buckets = _count_buckets(1 << 20)
        self._prompt = histogram("vllm:request_prompt_tokens",
                                 "Prompt tokens of each finished request.", token_buckets)
        self._generated = histogram("vllm:request_generation_tokens",
                                    "Generated tokens of each finished request.", token_buckets)
        self._tpot = histogram("vllm:request_time_per_output_token_seconds",
                               "Each finished request's mean time per output token after "
                               "the first.", _TOKEN_SECONDS)

    def alias(self, registry: CollectorRegistry,
              pairs: tuple[tuple[str, MetricWrapperBase, str], ...]) -> None:
        """Re-export each ``(vLLM name, kvrelay metric, help)`` under the vLLM name."""
        registry.register(_Aliases(self.model, pairs))

    def watch_engine(self, registry: CollectorRegistry,
                     stats: Callable[[], dict[str, Any]]) -> None:
        """Export the engine's gauges and totals, read from ``stats()`` at scrape time."""
        registry.register(_EngineCollector(self.model, stats))

    def request_ended(self, event: AnyEvent, enqueued_at: float, claimed_at: float,
                      now: float) -> None:
        """Record a job that ended on this worker with ``event`` (its terminal one)."""
        reason = finished_reason(event)
        if reason is None:
            return
        self._success[reason].inc()
        self._e2e.observe(max(0.0, now - enqueued_at))
        self._queue.observe(max(0.0, claimed_at - enqueued_at))
        if isinstance(event, Finished):
            usage = event.usage
            self._prompt.observe(usage.prompt_tokens)
            self._generated.observe(usage.completion_tokens)
            if usage.completion_tokens > 1:
                self._tpot.observe(event.timings.decode / (usage.completion_tokens - 1))


def _count_buckets(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit``: token counts over many magnitudes."""
    buckets: list[float] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return tuple(buckets)
            buckets.append(float(step * scale))
        scale *= 10


class _Aliases(Collector):
    """kvrelay's own series, renamed and labelled with the model at scrape time."""

    def __init__(self, model: str,
                 pairs: tuple[tuple[str, MetricWrapperBase, str], ...]) -> None:
        self._model = model
        self._pairs = pairs

    def collect(self) -> Iterator[Metric]:
        for name, metric, doc in self._pairs:
            for family in metric.collect():
                alias = Metric(name, doc, family.type)
                for sample in family.samples:
                    alias.add_sample(name + sample.name[len(family.name):],
                                     {**sample.labels, MODEL_LABEL: self._model},
                                     sample.value, sample.timestamp, sample.exemplar)
                yield alias


class _EngineCollector(Collector):
    """Engine gauges as they are now; engine totals as counters that only go up."""

    def __init__(self, model: str, stats: Callable[[], dict[str, Any]]) -> None:
        self._model = model
        self._stats = stats
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._totals: dict[str, float] = {}

    def _advance(self, stats: dict[str, Any]) -> dict[str, float]:
        """Each total's counter, grown by what the engine's total grew since last read (a
        total that went down started again: all of it is new)."""
        with self._lock:
            for _, key, _ in ENGINE_COUNTERS:
                now = float(stats.get(key, 0) or 0)
                before = self._seen.get(key, 0.0)
                self._totals[key] = self._totals.get(key, 0.0) + (
                    now - before if now >= before else now)
                self._seen[key] = now
            return dict(self._totals)

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        labels = [MODEL_LABEL]
        for name, key, doc in ENGINE_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric([self._model], float(stats.get(key, 0) or 0))
            yield gauge
        totals = self._advance(stats)
        for name, key, doc in ENGINE_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric([self._model], totals[key])
            yield counter
