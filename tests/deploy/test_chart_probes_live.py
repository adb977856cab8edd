"""The chart's worker and gateway containers, run for real: their rendered commands and
environments (Secrets resolved), probed on the paths and ports the rendered probes name.
The worker must be live but not ready while it loads its model, ready only once it
consumes its queue, and leave within the pod's termination grace on SIGTERM."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers.container_process import ContainerProcess, local_env
from helpers.helm_chart import Obj, container, container_env, named, port_number, render
from helpers.redis_server import free_port

pytestmark = pytest.mark.integration

SERVED = "llama-mqa"
KEY = "tiny"


@dataclass
class Probe:
    path: str
    port: int


def http_probe(spec: Obj, kind: str) -> Probe:
    get = spec[kind]["httpGet"]
    return Probe(get["path"], port_number(spec, get["port"]))


def values(redis_url: str, model: str) -> dict:
    return {
        "redis": {"internal": {"enabled": False},
                  "external": {"address": "127.0.0.1:6379"},
                  "auth": {"url": redis_url, "passwordKey": ""}},
        "workerDefaults": {"metricsPort": free_port(), "shutdownGrace": 5},
        "workers": {
            "smollm2": {"enabled": False},
            KEY: {"device": "cpu", "model": model, "servedModelName": SERVED,
                  # The tiny model needs a small KV pool; the default only slows the start.
                  "env": {"KVRELAY_CONCURRENCY": "2", "KVRELAY_KV_CACHE_MEMORY": "268435456",
                          "KVRELAY_SWAP_SPACE_GIB": "0.25"}},
        },
        "gateway": {"port": free_port()},
    }


@pytest.fixture
def objects(clean_redis_url: str, tiny_model_path: str, tmp_path: Path) -> list[Obj]:
    return render(values(clean_redis_url, tiny_model_path), tmp_path)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[ContainerProcess]]:
    processes: list[ContainerProcess] = []
    yield processes
    for process in processes:
        process.stop()


def run(objects: list[Obj], deployment: str, name: str, tmp_path: Path,
        started: list[ContainerProcess]) -> tuple[Obj, ContainerProcess]:
    spec = container(named(objects, "Deployment", deployment), name)
    env = local_env(container_env(objects, spec), tmp_path / "root")
    process = ContainerProcess(spec["command"], env, tmp_path / f"{name}.log").start()
    started.append(process)
    return spec, process


def get(probe: Probe) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{probe.port}{probe.path}", timeout=2.0)
    except httpx.HTTPError:
        return None


def test_worker_is_ready_only_once_loaded_and_consuming(
        objects: list[Obj], tmp_path: Path, started: list[ContainerProcess]) -> None:
    spec, worker = run(objects, f"kv-kvrelay-worker-{KEY}", "worker", tmp_path, started)
    ready, live = http_probe(spec, "readinessProbe"), http_probe(spec, "livenessProbe")
    assert http_probe(spec, "startupProbe") == live
    assert ready.port == live.port == int(container_env(objects, spec)["KVRELAY_METRICS_PORT"])

    not_ready_while_loading = live_while_loading = False
    deadline = time.monotonic() + 240
    while True:
        assert worker.alive(), worker.tail()
        assert time.monotonic() < deadline, f"never ready:\n{worker.tail()}"
        loaded = "ready: model" in worker.tail(100_000)  # the runtime's line after the load
        answer = get(ready)
        if answer is not None and answer.status_code == 200:
            break
        if answer is not None and not loaded:
            assert answer.status_code == 503, answer.text
            not_ready_while_loading = True
            live_answer = get(live)
            assert live_answer is not None
            assert live_answer.status_code == 200, live_answer.text
            live_while_loading = True
        time.sleep(0.05)
    assert not_ready_while_loading, "the probe server must answer during the model load"
    assert live_while_loading
    log = worker.tail(100_000)
    assert "ready: model" in log
    # Ready means consuming: Celery announces its consumer right after it told the probes.
    consumer_deadline = time.monotonic() + 10
    while " ready." not in worker.tail(100_000).split("ready: model", 1)[1]:
        assert time.monotonic() < consumer_deadline, worker.tail()
        time.sleep(0.05)
    live_answer = get(live)
    assert live_answer is not None
    assert live_answer.status_code == 200
    assert "engine thread is running" in live_answer.text
    metrics = httpx.get(f"http://127.0.0.1:{ready.port}/metrics", timeout=5).text
    assert "kvrelay_running_sequences" in metrics

    grace = named(objects, "Deployment", f"kv-kvrelay-worker-{KEY}")["spec"]["template"][
        "spec"]["terminationGracePeriodSeconds"]
    worker.terminate()
    assert worker.wait(timeout=grace) == 0, worker.tail()


def test_gateway_serves_the_ready_worker_on_its_declared_ports(
        objects: list[Obj], tmp_path: Path, started: list[ContainerProcess]) -> None:
    worker_spec, worker = run(objects, f"kv-kvrelay-worker-{KEY}", "worker", tmp_path,
                              started)
    gateway_spec, gateway = run(objects, "kv-kvrelay-gateway", "gateway", tmp_path, started)
    health = http_probe(gateway_spec, "readinessProbe")
    live_port = port_number(gateway_spec, gateway_spec["livenessProbe"]["tcpSocket"]["port"])
    service = named(objects, "Service", "kv-kvrelay-gateway")
    [service_port] = service["spec"]["ports"]
    assert port_number(gateway_spec, service_port["targetPort"]) == health.port == live_port

    deadline = time.monotonic() + 240
    ready = http_probe(worker_spec, "readinessProbe")
    while not all(r is not None and r.status_code == 200 for r in (get(health), get(ready))):
        assert worker.alive(), worker.tail()
        assert gateway.alive(), gateway.tail()
        assert time.monotonic() < deadline, worker.tail() + gateway.tail()
        time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", live_port), timeout=5):
        pass  # the liveness probe's TCP connect
    answer = httpx.post(f"http://127.0.0.1:{health.port}/v1/completions", timeout=120, json={
        "model": SERVED, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] >= 1
