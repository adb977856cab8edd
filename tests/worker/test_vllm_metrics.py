"""A real worker's ``/metrics`` carries vLLM's series, each of vLLM's type, labelled
``model_name``, and their values follow the jobs run through the SDK: request counts by
finish reason, token counts equal to the jobs' usage, one histogram sample per request.

Three greedy jobs on one 40-token prompt: two end at ``max_tokens`` ("length"), one on a
stop token taken from the first job's output ("stop"); the later two hit the prefix
cache. Then a long job is cancelled mid-stream ("abort").
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from helpers.prom_scrape import VLLM_SERIES, Scrape, parse, scrape
from helpers.redis_server import free_port
from helpers.worker_process import WorkerProcess
from prometheus_client import generate_latest

from kvrelay import Client
from kvrelay.completion import Completion
from kvrelay_worker.metrics import WorkerMetrics

MODEL = "llama-mqa"
PROMPT = list(range(100, 140))


def _wait_for(url: str, check: Callable[[Scrape], bool], timeout: float = 30) -> Scrape:
    deadline = time.monotonic() + timeout
    while True:
        now = scrape(url)
        if check(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.integration
def test_vllm_series_follow_the_jobs_run(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    port = free_port()
    worker = start_worker("vllm-metered", concurrency=2, metrics_port=port)
    url = f"http://127.0.0.1:{port}/metrics"
    done: list[Completion] = []
    with Client(clean_redis_url, model=MODEL) as client:
        for _ in range(2):
            done.append(client.generate(prompt_token_ids=PROMPT, max_tokens=12,
                                        temperature=0.0, ignore_eos=True))
        done.append(client.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=0.0,
                                    ignore_eos=True, stop_token_ids=[done[0].token_ids[4]]))
    assert [c.finish_reason for c in done] == ["length", "length", "stop"]
    stats = worker.wait_for_stats(lambda s: s["free_blocks"] == s["total_blocks"])
    after = scrape(url)

    for name, kind in VLLM_SERIES.items():
        assert after.types.get(name) == kind, (name, after.types.get(name))
        assert has_vllm_labels(after, name), (name, after.labels.get(name))
    model = {"model_name": MODEL}
    success = "vllm:request_success_total"
    assert after.value(success, finished_reason="length", **model) == 2
    assert after.value(success, finished_reason="stop", **model) == 1
    assert after.value(success, finished_reason="abort", **model) == 0
    assert after.value(success, finished_reason="error", **model) == 0
    prompt = sum(c.usage.prompt_tokens for c in done)
    generated = sum(c.usage.completion_tokens for c in done)
    assert prompt == 3 * len(PROMPT)
    assert after.value("vllm:prompt_tokens_total", **model) == prompt
    assert after.value("vllm:generation_tokens_total", **model) == generated
    assert after.value("vllm:request_prompt_tokens_sum", **model) == prompt
    assert after.value("vllm:request_generation_tokens_sum", **model) == generated
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens",
                      "vllm:request_generation_tokens",
                      "vllm:request_time_per_output_token_seconds"):
        assert after.value(f"{histogram}_count", **model) == 3, histogram
        assert after.value(f"{histogram}_bucket", le="+Inf", **model) == 3, histogram
    # One inter-token sample per token event after a job's first (tokens may travel
    # several to an event): kvrelay's own measurement, under vLLM's name.
    itl = after.value("vllm:inter_token_latency_seconds_count", **model)
    assert 0 < itl <= generated - 3
    assert itl == after.value("kvrelay_inter_token_latency_seconds_count")
    assert after.value("vllm:time_per_output_token_seconds_count", **model) == itl
    e2e = after.value("vllm:e2e_request_latency_seconds_sum", **model)
    assert 0 < sum(c.timings.total for c in done) * 0.5 < e2e < 60
    # Engine state: idle now; its running totals exported as they stand.
    assert after.value("vllm:num_requests_running", **model) == 0
    assert after.value("vllm:num_requests_waiting", **model) == 0
    assert after.value("vllm:kv_cache_usage_perc", **model) == 0
    hits = after.value("vllm:prefix_cache_hits_total", **model)
    assert hits == stats["prefix_cache_hits"] > 0  # the later two jobs reused the prompt
    assert after.value("vllm:prefix_cache_queries_total", **model) == \
        stats["prefix_cache_queries"] >= prompt - len(PROMPT)
    assert after.value("vllm:num_preemptions_total", **model) == stats["preemptions"]
    # kvrelay's own series stay, with the same figures.
    assert after.value("kvrelay_generated_tokens_total") == generated
    assert after.value("kvrelay_jobs_total", outcome="finished") == 3

    # A job cancelled mid-stream ends as vLLM's "abort": counted, timed, no token figures.
    with Client(clean_redis_url, model=MODEL) as client:
        with client.stream(prompt_token_ids=PROMPT[:8], max_tokens=100_000, ignore_eos=True,
                           temperature=0.0) as stream:
            next(iter(stream))
            client.cancel(stream.job_id)
    aborted = _wait_for(url, lambda s: s.value(success, finished_reason="abort", **model) == 1)
    assert aborted.value(success, finished_reason="abort", **model) == 1
    assert aborted.value("vllm:e2e_request_latency_seconds_count", **model) == 4
    assert aborted.value("vllm:request_prompt_tokens_count", **model) == 3
    assert aborted.value("vllm:prompt_tokens_total", **model) == prompt + 8


def has_vllm_labels(scraped: Scrape, family: str) -> bool:
    """The family's labels are vLLM's: ``model_name`` (and the reason or the bucket)."""
    return scraped.labels.get(family, set()) - {"le", "finished_reason"} == {"model_name"}


def test_engine_totals_are_counters_that_never_go_down() -> None:
    """The engine's running totals become counters fed by their growth: when the totals
    start again (a new engine), the counters go on from where they were."""
    engine: dict[str, float] = {"preemptions": 3, "prefix_cache_hits": 10,
                                "prefix_cache_queries": 40, "spec_proposed_tokens": 8}
    metrics = WorkerMetrics("m")
    metrics.watch_engine(lambda: dict(engine))

    def counters() -> tuple[float, ...]:
        scraped = parse(generate_latest(metrics.registry).decode())
        return tuple(scraped.value(f"vllm:{name}_total", model_name="m") for name in (
            "num_preemptions", "prefix_cache_hits", "prefix_cache_queries",
            "spec_decode_num_draft_tokens"))

    assert counters() == (3, 10, 40, 8)
    assert counters() == (3, 10, 40, 8)  # a scrape itself changes nothing
    engine.update(preemptions=5, prefix_cache_hits=16, prefix_cache_queries=60)
    assert counters() == (5, 16, 60, 8)
    engine.update(preemptions=1, prefix_cache_hits=0, prefix_cache_queries=4,
                  spec_proposed_tokens=2)  # the totals started again from zero
    assert counters() == (6, 16, 64, 10)
    # kvrelay's own gauges show the engine's totals as they are.
    text = generate_latest(metrics.registry).decode()
    assert parse(text).value("kvrelay_preemptions") == 1
