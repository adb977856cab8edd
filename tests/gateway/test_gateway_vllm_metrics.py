"""Requests through a real gateway show up on the worker's ``/metrics`` under vLLM's names
(counts and token totals equal to what the gateway answered), and the gateway's own
``/metrics`` carries each model's queue depth, read from Redis when scraped.

The worker's KV pool holds one ~75-token job but not two, so two concurrent requests make
the engine preempt one: the preemption counter must show it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from helpers.gateway_process import GatewayProcess
from helpers.prom_scrape import VLLM_SERIES, scrape
from helpers.redis_server import free_port
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "tiny"
# llama-mqa: 3 layers x (k, v) x 1 kv head x 64 dims x 16 tokens x 4 bytes per block.
BLOCK_BYTES = 3 * 2 * 1 * 64 * 16 * 4
POOL_BLOCKS = 6  # 96 tokens: one job of ~75 fits, two do not
MAX_TOKENS = 72


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_worker_metrics_follow_gateway_requests_and_the_gateway_shows_queues(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(concurrency=2, model_name=MODEL, swap_space_gib=0,
                          kv_cache_memory=POOL_BLOCKS * BLOCK_BYTES, metrics_port=port)
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway").start()
    try:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": MAX_TOKENS,
                "ignore_eos": True, "temperature": 0}
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: _post(gateway.url, "/v1/completions", body),
                                    range(2)))
        answers.append(_post(gateway.url, "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 5, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "hi"}]}))
        stats = worker.wait_for_stats(lambda s: s.get("requests") == 0)
        worker_side = scrape(f"http://127.0.0.1:{port}/metrics")
        gateway_side = scrape(f"{gateway.url}/metrics")
    finally:
        gateway.stop()

    model = {"model_name": MODEL}
    for name, kind in VLLM_SERIES.items():
        assert worker_side.types.get(name) == kind, name
    reasons = [choice["finish_reason"] for answer in answers for choice in answer["choices"]]
    assert reasons == ["length"] * 3
    assert worker_side.value("vllm:request_success_total", finished_reason="length",
                             **model) == 3
    prompt = sum(answer["usage"]["prompt_tokens"] for answer in answers)
    generated = sum(answer["usage"]["completion_tokens"] for answer in answers)
    assert generated == 2 * MAX_TOKENS + 5
    assert worker_side.value("vllm:prompt_tokens_total", **model) == prompt
    assert worker_side.value("vllm:generation_tokens_total", **model) == generated
    assert worker_side.value("vllm:request_generation_tokens_sum", **model) == generated
    assert worker_side.value("vllm:e2e_request_latency_seconds_count", **model) == 3
    assert worker_side.value("vllm:time_to_first_token_seconds_count", **model) == 3
    preemptions = worker_side.value("vllm:num_preemptions_total", **model)
    assert preemptions == stats["preemptions"] >= 1, "the pool was never short"

    # The gateway's own view: the model is served by one worker, nothing waits.
    queue = {"namespace": "", "model": MODEL}
    assert gateway_side.value("kvrelay_queue_depth", **queue) == 0
    assert gateway_side.value("kvrelay_queue_in_redis", **queue) == 0
    assert gateway_side.value("kvrelay_model_workers", **queue) == 1
    assert gateway_side.value("kvrelay_queue_read_ok", namespace="") == 1
    assert gateway_side.value("kvrelay_gateway_requests_total", route="completions",
                              status="200") == 2


async def test_queue_depth_is_the_list_length_while_no_worker_consumes(
        clean_redis_url: str, tmp_path: Path) -> None:
    """Jobs queued for a model no worker serves (its worker died, or none started yet):
    the gateway reports them, as many as the model's Redis list holds."""
    gateway = GatewayProcess(clean_redis_url, tmp_path, "gateway").start()
    client = AsyncClient(clean_redis_url, model="unserved", require_worker=False)
    try:
        streams = [client.stream(prompt_token_ids=[5, 6, 7], max_tokens=2) for _ in range(5)]
        await asyncio.gather(*(stream.start() for stream in streams))
        raw = redis.Redis.from_url(clean_redis_url)
        try:
            length = raw.llen(Keyspace().queue("unserved"))
        finally:
            raw.close()
        assert length == 5
        scraped = await asyncio.to_thread(scrape, f"{gateway.url}/metrics")
        queue = {"namespace": "", "model": "unserved"}
        assert scraped.value("kvrelay_queue_depth", **queue) == length
        assert scraped.value("kvrelay_queue_in_redis", **queue) == length
        assert scraped.value("kvrelay_queue_in_engines", **queue) == 0
        assert scraped.value("kvrelay_model_workers", **queue) == 0
    finally:
        await client.aclose()
        gateway.stop()
