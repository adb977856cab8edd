"""A tenant with a namespace of its own: its gateway requests reach only its workers,
queues and logs, and it sees only its own models; other tenants see none of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from helpers.gateway_process import GatewayProcess
from helpers.sse_client import events
from helpers.worker_process import WorkerProcess

from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

ALICE = {"Authorization": "Bearer sk-alice"}  # tenant alice, namespace team-a
BOB = {"Authorization": "Bearer sk-bob"}  # tenant bob, the gateway's (default) namespace


@pytest.fixture
def gateway(clean_redis_url: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(clean_redis_url, tmp_path, "gateway",
                             KVRELAY_GATEWAY_API_KEYS="sk-alice=alice,sk-bob=bob",
                             KVRELAY_GATEWAY_TENANT_NAMESPACES="alice=team-a").start()
    try:
        yield process
    finally:
        process.stop()


def models(gateway: GatewayProcess, headers: dict[str, str]) -> list[str]:
    response = httpx.get(f"{gateway.url}/v1/models", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return [m["id"] for m in response.json()["data"]]


def streamed_job(gateway: GatewayProcess, headers: dict[str, str], model: str) -> str:
    request = {"model": model, "prompt": [5, 6, 7], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=request, headers=headers,
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        seen = list(events(response))
    assert seen[-1][1] == "[DONE]"
    return seen[0][0].rpartition(":")[0]


def test_a_namespaced_tenant_reaches_only_its_own_workers_and_logs(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        gateway: GatewayProcess) -> None:
    start_worker("team-a", concurrency=2, namespace="team-a", model_name="alpha")
    start_worker("shared", concurrency=2)  # the default namespace: serves "llama-mqa"
    assert models(gateway, ALICE) == ["alpha"]
    assert models(gateway, BOB) == ["llama-mqa"]

    alice_job = streamed_job(gateway, ALICE, "alpha")
    bob_job = streamed_job(gateway, BOB, "llama-mqa")
    store = redis.Redis.from_url(clean_redis_url)
    try:
        team_a, default = Keyspace("team-a"), Keyspace()
        assert store.xlen(team_a.event_log(alice_job)) > 0
        assert store.exists(default.event_log(alice_job)) == 0
        assert store.xlen(default.event_log(bob_job)) > 0
        assert store.exists(team_a.event_log(bob_job)) == 0
    finally:
        store.close()

    # Each tenant's model names mean nothing in the other's namespace.
    for headers, model in ((ALICE, "llama-mqa"), (BOB, "alpha")):
        response = httpx.post(f"{gateway.url}/v1/completions", headers=headers, timeout=30,
                              json={"model": model, "prompt": [5], "max_tokens": 1})
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "model_not_found"
