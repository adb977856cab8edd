"""``compose.yaml`` and ``worker/Dockerfile``, checked without a Docker engine: the Compose
specification's JSON schema (a vendored copy), then what kvrelay's stack needs."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HA = ("redis-replica", "sentinel-1", "sentinel-2", "sentinel-3", "worker-ha", "gateway-ha")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    # The file names draft 2019-09 by an old URL jsonschema does not recognise.
    validator = jsonschema.Draft201909Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(document)]  # fmt: skip


def test_matches_the_compose_schema(compose: dict[str, Any]) -> None:
    assert schema_errors(compose) == []


def test_the_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["deploy"]["resources"]["reservations"]["gpus"] = 1
    broken["services"]["redis"]["healthcheck"]["interval"] = ["5s"]
    errors = schema_errors(broken)
    assert any("reservations" in error for error in errors), errors
    assert any("healthcheck" in error for error in errors), errors


def test_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"redis", "worker", "worker-cpu", "gateway", "flower", *HA}
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    for name in HA:
        assert services[name]["profiles"] == ["ha"], name
    for name in ("redis", "worker", "gateway", "flower"):
        assert "profiles" not in services[name], f"{name} must start by default"


def test_redis_is_health_checked_and_persistent(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    # The official image unless KVRELAY_REDIS_IMAGE names another (deploy/redis/Dockerfile).
    assert re.fullmatch(r"\$\{KVRELAY_REDIS_IMAGE:-redis:7[\w.-]*\}", redis["image"])
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])


def test_gpu_worker(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["build"] == {"context": ".", "dockerfile": "worker/Dockerfile",
                               "target": "gpu"}
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert device["driver"] == "nvidia"
    # Every GPU, so CUDA_VISIBLE_DEVICES (kvrelay compose --gpus) can pick any of them.
    assert device["count"] == "all"
    assert "CUDA_VISIBLE_DEVICES" in worker["environment"]
    assert worker["environment"]["KVRELAY_DEVICE"] == "cuda"
    assert worker["environment"]["KVRELAY_REDIS_URL"] == "redis://redis:6379/0"
    assert worker["command"][:2] == ["kvrelay", "worker"]
    assert "--events" in worker["command"]  # task events for Flower


def test_cpu_worker(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker-cpu"]
    assert "deploy" not in worker
    assert worker["environment"]["KVRELAY_DEVICE"] == "cpu"
    assert worker["build"]["dockerfile"] == "worker/Dockerfile"
    assert worker["build"]["target"] == "cpu"
    assert "cpu" in worker["build"]["args"]["TORCH_INDEX_URL"]
    assert not worker["build"]["args"]["BASE_IMAGE"].startswith("nvidia/")


@pytest.mark.parametrize("name", ["worker", "worker-cpu"])
def test_workers_keep_models_on_a_volume(compose: dict[str, Any], name: str) -> None:
    worker = compose["services"][name]
    cache_dir = worker["environment"].get("KVRELAY_CACHE_DIR", "/var/cache/kvrelay")
    mounts = dict(volume.split(":", 1) for volume in worker["volumes"])
    assert mounts.get("model-cache") == cache_dir
    assert "model-cache" in compose["volumes"]
    assert "redis-data" in compose["volumes"]
    port = worker["environment"]["KVRELAY_METRICS_PORT"]
    assert f":{port}/ready" in " ".join(worker["healthcheck"]["test"])  # not during the load
    assert worker["stop_grace_period"]


@pytest.mark.parametrize("name", ["worker", "worker-cpu", "flower"])
def test_depends_on_a_healthy_redis(compose: dict[str, Any], name: str) -> None:
    assert compose["services"][name]["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            # ${KVRELAY_MODELS_DIR:-./models}: the default stands for the variable.
            source = re.sub(r"^\$\{\w+:-([^}]*)\}", r"\1", volume).split(":", 1)[0]
            if not source.startswith((".", "/", "~")):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"


def test_flower_watches_the_same_redis(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    assert flower["image"].startswith("mher/flower")
    assert flower["environment"]["CELERY_BROKER_URL"] == "redis://redis:6379/0"


def test_dockerfile() -> None:
    """The stages themselves: tests/e2e/test_images.py."""
    text = (REPO / "worker" / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^ARG BASE_IMAGE=nvidia/cuda:\S+", text, re.M)
    assert re.search(r'pip install --index-url "\$TORCH_INDEX_URL" [^\n]*\\\n\s*"torch==', text)
    assert re.search(r'^CMD \["kvrelay", "worker"', text, re.M)
    for folder in ("client/", "kernels/", "worker/"):
        assert f"COPY {folder} {folder}" in text
    ignore = (REPO / "worker" / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    assert "!client/" in ignore
    assert "!worker/" in ignore


def test_ci_runs_the_documented_commands() -> None:
    run = REPO / ".ci" / "run"
    assert run.stat().st_mode & 0o111, ".ci/run must be executable"
    script = run.read_text(encoding="utf-8")
    assert "set -euo pipefail" in script
    assert "make test" in script
    assert "make lint" in script
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for target in ("install", "demo", "test", "lint", "bench", "clean"):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_gateway_serves_openai_on_loopback(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["command"][:2] == ["kvrelay", "gateway"]
    assert gateway["command"][gateway["command"].index("--host") + 1] == "0.0.0.0"
    port = gateway["command"][gateway["command"].index("--port") + 1]
    assert gateway["ports"] == [f"127.0.0.1:${{KVRELAY_GATEWAY_PORT:-8000}}:{port}"]
    assert gateway["environment"]["KVRELAY_REDIS_URL"] == "redis://redis:6379/0"
    assert gateway["depends_on"]["redis"]["condition"] == "service_healthy"
    assert f"127.0.0.1:{port}/" in " ".join(gateway["healthcheck"]["test"])
    for name in ("gateway", "gateway-ha"):  # the slim image, built in every profile
        assert compose["services"][name]["build"]["dockerfile"] == "deploy/gateway/Dockerfile"
        assert compose["services"][name]["image"] == "kvrelay-gateway:latest"


def _sentinel_conf(service: dict[str, Any]) -> list[str]:
    """The lines a sentinel service writes into its config file before it starts."""
    command = service["command"]
    assert command[:2] == ["sh", "-c"]
    script = command[2]
    assert script.endswith("exec redis-server /tmp/sentinel.conf --sentinel")
    return re.findall(r"'([^']*)'", script.split(">", 1)[0])[1:]  # after printf's format


def test_ha_profile_replicates_and_watches_the_primary(compose: dict[str, Any]) -> None:
    services = compose["services"]
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:][:2] == ["redis", "6379"]
    assert replica[replica.index("--appendonly") + 1] == "yes"
    assert services["redis-replica"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    for name in SENTINELS:
        conf = _sentinel_conf(services[name])
        # Hostnames must resolve before the monitor line names the primary by one.
        assert conf.index("sentinel resolve-hostnames yes") < \
            conf.index("sentinel monitor kvrelay redis 6379 2")
        assert "port 26379" in conf
        assert services[name]["healthcheck"]["test"][-1] == "kvrelay"


def test_ha_failover_fits_in_the_workers_lease(compose: dict[str, Any]) -> None:
    """The rule docs/sentinel.md states: a failover (down-after plus about a second of
    election) shorter than the lease takes nothing over."""
    from kvrelay_worker.settings import WorkerSettings

    # Passed through from the shell (None here) or the worker's default.
    lease_s = float(compose["services"]["worker-ha"]["environment"].get("KVRELAY_LEASE_TTL")
                    or WorkerSettings().lease_ttl)
    for name in SENTINELS:
        [line] = [x for x in _sentinel_conf(compose["services"][name])
                  if x.startswith("sentinel down-after-milliseconds")]
        assert int(line.split()[-1]) / 1000 + 1.0 < lease_s, line


@pytest.mark.parametrize("name", ["worker-ha", "gateway-ha"])
def test_ha_services_find_the_primary_through_the_sentinels(compose: dict[str, Any],
                                                            name: str) -> None:
    from kvrelay.sentinel_url import parse_sentinel_url

    service = compose["services"][name]
    target = parse_sentinel_url(service["environment"]["KVRELAY_REDIS_URL"])
    assert target.sentinels == tuple((host, 26379) for host in SENTINELS)
    assert target.master_name == "kvrelay"  # the name the sentinels monitor
    assert service["depends_on"] == {s: {"condition": "service_healthy"} for s in SENTINELS}


def test_ha_worker_is_the_gpu_worker_on_sentinels(compose: dict[str, Any]) -> None:
    worker, ha = compose["services"]["worker"], compose["services"]["worker-ha"]
    assert ha["command"] == worker["command"]
    assert ha["deploy"] == worker["deploy"]
    assert {k: v for k, v in ha["environment"].items() if k != "KVRELAY_REDIS_URL"} == \
        {k: v for k, v in worker["environment"].items() if k != "KVRELAY_REDIS_URL"}
