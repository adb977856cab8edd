"""The Prometheus endpoint is scraped and its counters move with the work done."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest
from helpers.redis_server import free_port
from helpers.worker_process import WorkerProcess

from kvrelay import Client

pytestmark = pytest.mark.integration


def _value(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (r"\{" + labels + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


def test_metrics_endpoint_counts_jobs_and_tokens(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    port = free_port()
    worker = start_worker("metered", concurrency=4, metrics_port=port)
    url = f"http://127.0.0.1:{port}/metrics"
    before = httpx.get(url, timeout=10).text
    for name in ("kvrelay_time_to_first_token_seconds_count",
                 "kvrelay_inter_token_latency_seconds_count", "kvrelay_e2e_latency_seconds_count",
                 "kvrelay_queue_time_seconds_count", "kvrelay_running_sequences",
                 "kvrelay_waiting_sequences", "kvrelay_kv_cache_usage_ratio",
                 "kvrelay_prefix_cache_hit_rate", "kvrelay_preemptions"):
        assert name in before, name
    with Client(clean_redis_url, model="llama-mqa") as client:
        for _ in range(3):
            client.generate(prompt_token_ids=list(range(100, 140)), max_tokens=16,
                            temperature=0.0, ignore_eos=True)
    worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"])
    after = httpx.get(url, timeout=10).text
    assert _value(after, "kvrelay_jobs_total", 'outcome="finished"') == \
        _value(before, "kvrelay_jobs_total", 'outcome="finished"') + 3
    assert _value(after, "kvrelay_generated_tokens_total") >= \
        _value(before, "kvrelay_generated_tokens_total") + 48
    assert _value(after, "kvrelay_prompt_tokens_total") >= 120
    assert _value(after, "kvrelay_time_to_first_token_seconds_count") >= 3
    assert _value(after, "kvrelay_inter_token_latency_seconds_count") >= 3
    assert _value(after, "kvrelay_e2e_latency_seconds_count") >= 3
    assert _value(after, "kvrelay_queue_time_seconds_count") >= 3
    # The same 40-token prompt three times: the later two hit the prefix cache.
    assert _value(after, "kvrelay_prefix_cache_hit_rate") > 0
    assert _value(after, "kvrelay_kv_total_blocks") > 0


def test_any_free_metrics_port_is_logged_and_in_the_heartbeat(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("anyport", concurrency=2, metrics_port=0)
    with Client(clean_redis_url) as client:
        (info,) = [w for w in client.workers() if w.pid == worker.pid]
    assert info.metrics_port is not None
    assert info.metrics_port > 0
    assert f"metrics on 127.0.0.1 port {info.metrics_port}" in worker.tail(20000)
    scraped = httpx.get(f"http://127.0.0.1:{info.metrics_port}/metrics", timeout=10).text
    assert "kvrelay_running_sequences" in scraped
