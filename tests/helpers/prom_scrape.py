"""Scraping a real ``/metrics`` endpoint the way Prometheus reads it, and the vLLM series
(names and types, from vLLM's published metrics) that kvrelay's workers must export."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

# vLLM's names and types (the families: a counter's samples end in _total, a histogram's
# in _bucket/_sum/_count), as its metrics documentation lists them.
VLLM_SERIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


@dataclass
class Scrape:
    """One scrape: each family's type, and every sample's value by name and labels."""

    types: dict[str, str]
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    labels: dict[str, set[str]]

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name`` with exactly ``labels``; KeyError when it is not there."""
        return self.samples[(name, frozenset(labels.items()))]

    def total(self, name: str) -> float:
        """The sum of every sample called ``name``, whatever its labels."""
        return sum(v for (n, _), v in self.samples.items() if n == name)


def parse(text: str) -> Scrape:
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
            labels.setdefault(family.name, set()).update(sample.labels)
    return Scrape(types, samples, labels)


def scrape(url: str) -> Scrape:
    """GET ``url`` (a ``/metrics`` endpoint) and parse it."""
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)
