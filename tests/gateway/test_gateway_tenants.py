"""API keys map to tenants: each has its own prefix cache (cache_salt), and one tenant can
neither resume nor cancel another's job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.job_log import wait_terminal
from helpers.sse_client import events
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Failed

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


@pytest.fixture
def gateway(clean_redis_url: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(clean_redis_url, tmp_path, "gateway",
                             KVRELAY_GATEWAY_API_KEYS="sk-alice=alice,sk-bob=bob").start()
    try:
        yield process
    finally:
        process.stop()


def cached(gateway: GatewayProcess, headers: dict[str, str]) -> int:
    prompt = list(range(40, 90))  # several full KV blocks
    response = httpx.post(f"{gateway.url}/v1/completions", headers=headers, timeout=60,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert response.status_code == 200, response.text
    count: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return count


def test_each_tenant_has_its_own_prefix_cache(start_worker: Callable[..., WorkerProcess],
                                              gateway: GatewayProcess) -> None:
    start_worker(concurrency=2)
    assert cached(gateway, ALICE) == 0
    assert cached(gateway, ALICE) > 0  # alice's second time: from her cache
    assert cached(gateway, BOB) == 0  # bob does not see alice's entries


def test_a_tenant_cannot_resume_or_cancel_anothers_job(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        gateway: GatewayProcess) -> None:
    start_worker(concurrency=2)
    request = {"model": MODEL, "prompt": [5, 6], "max_tokens": 3000, "ignore_eos": True,
               "stream": True, "resumable": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=request, headers=ALICE,
                      timeout=60) as response:
        event_id, _ = next(events(response))
    job = event_id.rpartition(":")[0]
    stolen = httpx.post(f"{gateway.url}/v1/completions", json=request,
                        headers={**BOB, "Last-Event-ID": event_id}, timeout=10)
    assert stolen.status_code == 404
    assert stolen.json()["error"]["code"] == "job_not_found"
    refused = httpx.post(f"{gateway.url}/v1/jobs/{job}/cancel", headers=BOB)
    assert refused.status_code == 404
    # The job is still running for alice: she can resume it, then cancel it.
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=request,
                      headers={**ALICE, "Last-Event-ID": event_id}, timeout=60) as response:
        assert response.status_code == 200
        resumed_id, _ = next(events(response))
    assert resumed_id.rpartition(":")[0] == job
    assert int(resumed_id.rpartition(":")[2]) > int(event_id.rpartition(":")[2])
    cancelled = httpx.post(f"{gateway.url}/v1/jobs/{job}/cancel", headers=ALICE)
    assert cancelled.status_code == 200
    log = wait_terminal(clean_redis_url, job, timeout=10)
    assert isinstance(log[-1], Failed)
    assert log[-1].code == "cancelled"
