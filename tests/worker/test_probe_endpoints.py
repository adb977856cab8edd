"""``/ready`` and ``/live`` on the worker's HTTP port follow the worker's state, over real
HTTP and a real engine thread: live until that thread dies, ready only between the load
(with Celery consuming) and the drain; every other path still serves the metrics."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from kvrelay_worker.http_endpoints import LIVE_PATH, READY_PATH, serve_endpoints
from kvrelay_worker.probes import WorkerProbes


@pytest.fixture
def served() -> Iterator[tuple[WorkerProbes, str]]:
    registry = CollectorRegistry()
    Counter("kvrelay_probe_test", "A series to find on /metrics", registry=registry).inc()
    probes = WorkerProbes()
    server = serve_endpoints(registry, 0, "127.0.0.1", probes)
    yield probes, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def status(base: str, path: str) -> tuple[int, str]:
    answer = httpx.get(base + path, timeout=5)
    return answer.status_code, answer.text.strip()


def test_probes_follow_the_worker_from_start_to_drain(served: tuple[WorkerProbes, str]) -> None:
    probes, base = served
    assert status(base, LIVE_PATH)[0] == 200  # loading: never restarted for a slow load
    assert status(base, READY_PATH) == (503, "loading the model")

    stop = threading.Event()
    engine = threading.Thread(target=stop.wait, name="kvrelay-engine", daemon=True)
    engine.start()
    probes.engine_loaded(engine.is_alive)
    assert status(base, READY_PATH)[0] == 503  # Celery does not consume yet
    probes.consuming()
    assert status(base, READY_PATH) == (200, "ready: the model is loaded and its queue consumed")
    assert status(base, LIVE_PATH) == (200, "the engine thread is running")

    probes.draining()
    assert status(base, READY_PATH) == (503, "draining")
    assert status(base, LIVE_PATH)[0] == 200
    stop.set()
    engine.join(5)


def test_a_dead_engine_thread_fails_both_probes(served: tuple[WorkerProbes, str]) -> None:
    probes, base = served
    engine = threading.Thread(target=lambda: None, name="kvrelay-engine", daemon=True)
    engine.start()
    probes.engine_loaded(engine.is_alive)
    probes.consuming()
    engine.join(5)
    assert status(base, LIVE_PATH) == (503, "the engine thread is gone")
    assert status(base, READY_PATH) == (503, "the engine thread is gone")


def test_metrics_are_served_beside_the_probes(served: tuple[WorkerProbes, str]) -> None:
    _, base = served
    for path in ("/metrics", "/"):
        code, text = status(base, path)
        assert code == 200
        assert "kvrelay_probe_test_total 1.0" in text
