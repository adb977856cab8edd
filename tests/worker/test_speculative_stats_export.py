"""The engine's speculative-decoding stats leave the worker by both doors: Prometheus
gauges and the heartbeat clients read (``Client.workers()``); the ready line names the
setting. The keys are the engine's ``stats()`` names; a missing key reads as 0."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.engine_run import one_torch_thread
from helpers.redis_db import fresh_db_url
from prometheus_client import generate_latest

from kvrelay import Client
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.runtime import WorkerRuntime
from kvrelay_worker.settings import WorkerSettings
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel

# As an engine that speculated for a while reports them (42 of 64 drafts accepted over
# 20 verifications: (42 + 20) / 20 tokens per verification).
SPEC_STATS: dict[str, Any] = {
    "spec_proposed_tokens": 64, "spec_accepted_tokens": 42, "spec_verify_steps": 20,
    "spec_acceptance_rate": 42 / 64, "spec_mean_accepted_length": 3.1,
}
GAUGES = {f"kvrelay_{key}": value for key, value in SPEC_STATS.items()}
DB = 10  # a database of this module's own on the test Redis


def scrape(metrics: WorkerMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {name: float(value) for name, value in
            re.findall(r"^(kvrelay_spec_\w+) ([0-9.e+-]+)$", text, flags=re.MULTILINE)}


def test_prometheus_exports_each_key_read_at_scrape_time() -> None:
    stats: dict[str, Any] = {}
    metrics = WorkerMetrics("m")
    metrics.watch_engine(lambda: stats)
    assert scrape(metrics) == dict.fromkeys(GAUGES, 0.0)  # an engine without the keys
    stats.update(SPEC_STATS)
    assert scrape(metrics) == pytest.approx(GAUGES)


class SpeculatingSimulatedEngine(SimulatedEngine):
    """The simulated engine, reporting speculation figures as the real engine will."""

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), **SPEC_STATS}


@pytest.fixture
def simulated_runtime(redis_url: str) -> Iterator[WorkerRuntime]:
    settings = WorkerSettings(redis_url=fresh_db_url(redis_url, DB), model="simulated",
                              concurrency=2, lease_ttl=2.0, lease_refresh=0.2,
                              watchdog_interval=0.2, speculative="ngram")
    engine = SpeculatingSimulatedEngine(StepTimeModel(0.0, 0.0), max_num_seqs=2)
    runtime = WorkerRuntime(settings, requeue=lambda job_id, payload: None,
                            engine=engine)  # type: ignore[arg-type]
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.shutdown(grace=1.0)


@pytest.mark.integration
def test_the_heartbeat_carries_the_keys_to_clients(simulated_runtime: WorkerRuntime) -> None:
    with Client(simulated_runtime.settings.redis_url) as client:
        (info,) = client.workers()
    assert {key: info.stats.get(key) for key in SPEC_STATS} == SPEC_STATS
    assert scrape(simulated_runtime.metrics) == pytest.approx(GAUGES)


@pytest.mark.integration
def test_the_ready_line_names_the_setting(redis_url: str, tiny_model_path: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    settings = WorkerSettings(redis_url=fresh_db_url(redis_url, DB), model=tiny_model_path,
                              model_name="tiny", device="cpu", concurrency=2,
                              enable_cuda_graphs=False, speculative="ngram",
                              speculative_tokens=6, speculative_ngram="1-3")
    caplog.set_level(logging.INFO, logger="kvrelay_worker.runtime")
    with one_torch_thread():
        runtime = WorkerRuntime(settings, requeue=lambda job_id, payload: None)
        runtime.start()
        runtime.shutdown(grace=0.0)
    (line,) = [r.getMessage() for r in caplog.records if " ready: " in r.getMessage()]
    assert "speculative decoding: ngram (k=6, n=1-3); CPU threads: " in line, line
