"""A caller that drops mid-stream cancels its job (blocks freed at once), unless it asked
for ``resumable``; the same for a non-streamed request."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.job_log import wait_terminal
from helpers.sse_client import events
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Failed, Finished

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
LONG = {"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 400, "temperature": 0,
        "ignore_eos": True, "stream": True}


@pytest.fixture
def gateway(clean_redis_url: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(clean_redis_url, tmp_path).start()
    try:
        yield process
    finally:
        process.stop()


def drop_after(gateway: GatewayProcess, count: int, **extra: object) -> tuple[str, float]:
    """Stream, read ``count`` events, close the connection; (job id, time closed)."""
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json={**LONG, **extra},
                      timeout=60) as response:
        seen = [event_id for _, (event_id, _) in zip(range(count), events(response))]
    event_id = seen[-1]
    return event_id.rpartition(":")[0], time.monotonic()


def test_dropping_the_stream_cancels_the_job(start_worker: Callable[..., WorkerProcess],
                                             clean_redis_url: str,
                                             gateway: GatewayProcess) -> None:
    worker = start_worker(concurrency=2)
    job, closed = drop_after(gateway, 3)
    log = wait_terminal(clean_redis_url, job, timeout=10)
    ended = time.monotonic()
    assert isinstance(log[-1], Failed)
    assert log[-1].code == "cancelled"
    assert ended - closed < 1.0  # the worker ended the job (and freed its blocks) at once
    stats = worker.wait_for_stats(lambda s: s["running"] == 0, timeout=5)
    assert stats["free_blocks"] == stats["total_blocks"]


def test_a_resumable_stream_keeps_running(start_worker: Callable[..., WorkerProcess],
                                          clean_redis_url: str,
                                          gateway: GatewayProcess) -> None:
    start_worker(concurrency=2)
    job, _ = drop_after(gateway, 3, resumable=True, max_tokens=60)
    log = wait_terminal(clean_redis_url, job, timeout=60)
    assert isinstance(log[-1], Finished)
    assert log[-1].usage.completion_tokens == 60


def test_dropping_a_whole_request_cancels_the_job(start_worker: Callable[..., WorkerProcess],
                                                  clean_redis_url: str,
                                                  gateway: GatewayProcess) -> None:
    worker = start_worker(concurrency=2)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}/v1/completions", json={**LONG, "stream": False,
                                                          "max_tokens": 3000}, timeout=1.5)
    closed = time.monotonic()
    stats = worker.wait_for_stats(lambda s: s["running"] == 0, timeout=5)
    assert stats["free_blocks"] == stats["total_blocks"]
    assert time.monotonic() - closed < 3.0  # one heartbeat (1 s) after the cancel

