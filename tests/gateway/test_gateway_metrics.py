"""``GET /metrics``: Prometheus text with requests by route and status, the TTFT histogram
and the number of open streams, as a real gateway serves them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.sse_client import events
from helpers.worker_process import WorkerProcess
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


@pytest.fixture
def gateway(clean_redis_url: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(clean_redis_url, tmp_path, "gateway").start()
    try:
        yield process
    finally:
        process.stop()


def samples(gateway: GatewayProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{gateway.url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def test_metrics_count_requests_ttft_and_open_streams(
        start_worker: Callable[..., WorkerProcess], gateway: GatewayProcess) -> None:
    start_worker(concurrency=2)
    url = f"{gateway.url}/v1/completions"
    ok = httpx.post(url, json={"model": MODEL, "prompt": [5, 6], "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200
    bad = httpx.post(url, json={"model": MODEL, "prompt": [5], "temperature": -1}, timeout=10)
    assert bad.status_code == 400

    long = {"model": MODEL, "prompt": [7, 8], "max_tokens": 3000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", url, json=long, timeout=60) as response:
        reader = events(response)  # kept: a dropped reader would close the connection
        next(reader)  # the first token is out
        during = samples(gateway)
        reader.close()
    deadline = time.monotonic() + 10
    after = samples(gateway)
    while after[("kvrelay_gateway_open_streams", ())] != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        after = samples(gateway)

    requests = "kvrelay_gateway_requests_total"
    assert after[(requests, (("route", "completions"), ("status", "200")))] == 2
    assert after[(requests, (("route", "completions"), ("status", "400")))] == 1
    assert during[("kvrelay_gateway_open_streams", ())] == 1
    assert after[("kvrelay_gateway_open_streams", ())] == 0
    assert after[("kvrelay_gateway_ttft_seconds_count", ())] == 1  # streams only
    assert 0 < after[("kvrelay_gateway_ttft_seconds_sum", ())] < 30
    assert after[("kvrelay_gateway_streamed_chunks_total", ())] >= 1
