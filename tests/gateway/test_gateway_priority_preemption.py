"""A tenant's priority ceiling is what keeps its jobs from preempting another tenant's on
a real engine: bob asks for ``priority=2**31-1``, the gateway clamps it to his ceiling, and
alice's running job keeps its KV blocks when hers is at least that ceiling; when hers is
below it, the same request preempts her (the control: the setup can preempt).

A real gateway (two keys, one namespace), a real Redis and a real worker on the tiny
model, whose KV pool holds either job whole but not both: once both have grown to fill
it, the engine preempts the lower-priority one (the newer one on a tie) by recompute,
and the victim cannot come back before the other ends (the other only grows, and the
victim must recompute its whole context). So the victim is always the one that finishes
last. The worker's preemption counter rises in both halves (a short pool preempts
someone; the priorities decide whom): it shows the pool was short, not who lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.sse_client import events
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import MAX_PRIORITY

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "tiny"
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
# llama-mqa: 3 layers x (k, v) x 1 kv head x 64 dims x 16 tokens x 4 bytes per block.
BLOCK_TOKENS = 16
BLOCK_BYTES = 3 * 2 * 1 * 64 * BLOCK_TOKENS * 4
POOL_BLOCKS = 6  # 96 tokens: one job of ~75 fits, two do not
MAX_TOKENS = 72
CONFIG = "[tenants.alice]\nmax_priority = 10\n[tenants.bob]\nmax_priority = 5\n"


@pytest.fixture
def gateway(start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
            tmp_path: Path) -> Iterator[tuple[GatewayProcess, WorkerProcess]]:
    worker = start_worker(concurrency=2, model_name=MODEL, swap_space_gib=0,
                          kv_cache_memory=POOL_BLOCKS * BLOCK_BYTES)
    assert worker.stats()["total_blocks"] == POOL_BLOCKS
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    process = GatewayProcess(clean_redis_url, tmp_path, "gateway", "--config", str(config),
                             KVRELAY_GATEWAY_API_KEYS="sk-alice=alice,sk-bob=bob").start()
    try:
        yield process, worker
    finally:
        process.stop()


class Reader(threading.Thread):
    """One streamed completion, read to its end: how it ended, and when."""

    def __init__(self, url: str, headers: dict[str, str], priority: int) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.priority = url, headers, priority
        self.first_token = threading.Event()
        self.finish_reason: str | None = None
        self.ended_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        body: dict[str, Any] = {"model": MODEL, "prompt": "hello", "max_tokens": MAX_TOKENS,
                                "ignore_eos": True, "temperature": 0, "stream": True,
                                "priority": self.priority}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                              headers=self.headers, timeout=60) as response:
                response.raise_for_status()
                for _, data in events(response):
                    if data == "[DONE]":
                        break
                    for choice in data["choices"]:
                        self.first_token.set()
                        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except BaseException as exc:  # reported by the test's thread
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.first_token.set()


def race(gateway: GatewayProcess, worker: WorkerProcess,
         alice_priority: int) -> tuple[Reader, Reader, int]:
    """Alice's job runs; then bob's, at the highest priority there is. Both read to the
    end; returns them and the preemptions the worker counted meanwhile."""
    before = worker.wait_for_stats(lambda stats: stats.get("requests") == 0)["preemptions"]
    alice = Reader(gateway.url, ALICE, alice_priority)
    bob = Reader(gateway.url, BOB, MAX_PRIORITY)
    alice.start()
    assert alice.first_token.wait(30), "alice's job never started"
    bob.start()
    for reader in (alice, bob):
        reader.join(60)
        assert not reader.is_alive()
        assert reader.error is None, reader.error
        assert reader.finish_reason == "length"
    after = worker.wait_for_stats(lambda stats: stats.get("requests") == 0)["preemptions"]
    return alice, bob, int(after) - int(before)


def test_a_clamped_priority_does_not_preempt_another_tenants_running_job(
        gateway: tuple[GatewayProcess, WorkerProcess]) -> None:
    process, worker = gateway
    # Bob's 2**31-1 becomes 5, alice's own priority: the tie goes against the newer job.
    alice, bob, preemptions = race(process, worker, alice_priority=5)
    assert preemptions >= 1, "the pool was never short: the test proves nothing"
    assert alice.ended_at < bob.ended_at, "alice's job was preempted by bob's"
    # Control: alice below bob's ceiling. The same request now preempts her job.
    alice, bob, preemptions = race(process, worker, alice_priority=4)
    assert preemptions >= 1
    assert bob.ended_at < alice.ended_at, "bob's higher priority did not preempt alice"
