"""What the chart promises about workers: one GPU each (none on the CPU variant), every
worker setting reachable from values, a termination grace that covers the drain, the
model from a volume or by name, disruption budgets over the right pods."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.chart_values import SCENARIOS
from helpers.helm_chart import (
    RenderError,
    container,
    container_env,
    named,
    of_kind,
    render,
    workers,
)

from kvrelay.cli.config import VARIABLES, validate_environment

# Variables the chart derives from its own keys (naming them in `env` is refused).
MANAGED = {"KVRELAY_MODEL": "model", "KVRELAY_MODEL_NAME": "servedModelName",
           "KVRELAY_DEVICE": "device", "KVRELAY_REDIS_URL": "redis.auth",
           "KVRELAY_METRICS_PORT": "metricsPort", "KVRELAY_METRICS_HOST": "(0.0.0.0)",
           "KVRELAY_SHUTDOWN_GRACE": "shutdownGrace", "KVRELAY_CACHE_DIR": "modelCache"}
WORKER_VARIABLES = sorted(v.name for v in VARIABLES if "worker" in v.users.split())
# WorkerRuntime.shutdown: after the grace, up to 10 s for the hand-back, then the threads.
HANDBACK_S = 10


def worker_named(objects: list[dict], key: str) -> dict:
    return named(objects, "Deployment", f"kv-kvrelay-worker-{key}")


def test_gpu_workers_take_one_gpu_and_cpu_workers_none(tmp_path: Path) -> None:
    objects = render(SCENARIOS["gpu-and-cpu-of-a-tenant"], tmp_path)
    gpu = worker_named(objects, "smollm2")
    resources = container(gpu, "worker")["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert container_env(objects, container(gpu, "worker"))["KVRELAY_DEVICE"] == "cuda"
    assert {t["key"] for t in gpu["spec"]["template"]["spec"]["tolerations"]} == \
        {"nvidia.com/gpu"}
    cpu = worker_named(objects, "smollm2-cpu")
    resources = container(cpu, "worker")["resources"]
    assert "nvidia.com/gpu" not in {**resources["requests"], **resources["limits"]}
    assert container_env(objects, container(cpu, "worker"))["KVRELAY_DEVICE"] == "cpu"
    assert "tolerations" not in cpu["spec"]["template"]["spec"]
    # worker/Dockerfile's two targets, as its build lines tag them.
    assert container(gpu, "worker")["image"] == "kvrelay-worker:latest"
    assert container(cpu, "worker")["image"] == "kvrelay-worker:cpu"


def test_the_cpu_variant_is_off_by_default(tmp_path: Path) -> None:
    assert [d["metadata"]["name"] for d in workers(render({}, tmp_path))] == \
        ["kv-kvrelay-worker-smollm2"]


def test_every_worker_setting_passes_through_values(tmp_path: Path) -> None:
    assert len(WORKER_VARIABLES) > 40  # the table was read
    passed = {name: f"value-of-{name.lower()}" for name in WORKER_VARIABLES
              if name not in MANAGED}
    objects = render({"workers": {"smollm2": {"env": passed}}}, tmp_path)
    env = container_env(objects, container(worker_named(objects, "smollm2"), "worker"))
    assert {name: env.get(name) for name in passed} == passed
    assert set(MANAGED) <= set(env)


@pytest.mark.parametrize("name", sorted(MANAGED))
def test_settings_the_chart_derives_are_refused_in_env(name: str, tmp_path: Path) -> None:
    with pytest.raises(RenderError, match=name):
        render({"workerDefaults": {"env": {name: "x"}}}, tmp_path)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_environments_are_valid_settings(scenario: str, tmp_path: Path) -> None:
    """The CLI's start-up check (known names, well-formed values) and the worker's own."""
    from kvrelay_worker.settings import WorkerSettings

    secrets = {"redis-credentials": {"url": "redis+sentinel://s0:26379/kvrelay/0"}}
    objects = render(SCENARIOS[scenario], tmp_path)
    for deployment in workers(objects):
        env = container_env(objects, container(deployment, "worker"), secrets)
        assert validate_environment(env) == [], deployment["metadata"]["name"]
        WorkerSettings.from_env(env)


@pytest.mark.parametrize("grace", [30, 7.5, 600])
def test_termination_grace_covers_the_drain(grace: float, tmp_path: Path) -> None:
    objects = render({"workerDefaults": {"shutdownGrace": grace}}, tmp_path)
    deployment = worker_named(objects, "smollm2")
    env = container_env(objects, container(deployment, "worker"))
    assert float(env["KVRELAY_SHUTDOWN_GRACE"]) == grace
    pod_grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert pod_grace >= grace + HANDBACK_S + 10


def test_worker_command_drains_on_sigterm(tmp_path: Path) -> None:
    """`kvrelay worker` execs Celery, so SIGTERM (no preStop needed) reaches the worker."""
    spec = container(worker_named(render({}, tmp_path), "smollm2"), "worker")
    assert spec["command"][:2] == ["kvrelay", "worker"]
    assert "lifecycle" not in spec


def test_model_by_name_into_a_hugging_face_cache(tmp_path: Path) -> None:
    objects = render(SCENARIOS["models-from-volumes-scaled-to-zero"], tmp_path)
    deployment = worker_named(objects, "llama")
    pod = deployment["spec"]["template"]["spec"]
    env = container_env(objects, container(deployment, "worker"))
    [init] = pod["initContainers"]
    assert init["command"][-3:] == ["acme/llama-1b", "main", env["KVRELAY_MODEL"]]
    assert env["KVRELAY_MODEL_NAME"] == "acme/llama-1b"
    init_env = {e["name"]: e for e in init["env"]}
    assert init_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token",
                                                                "key": "token"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in init["volumeMounts"] if m["name"] == "huggingface"]
    assert env["KVRELAY_MODEL"].startswith(mount["mountPath"] + "/")
    assert volumes["huggingface"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    [worker_mount] = [m for m in container(deployment, "worker")["volumeMounts"]
                      if m["name"] == "huggingface"]
    assert worker_mount == {**mount, "readOnly": True}


def test_model_from_a_volume_and_a_shared_cache(tmp_path: Path) -> None:
    objects = render(SCENARIOS["models-from-volumes-scaled-to-zero"], tmp_path)
    qwen = worker_named(objects, "qwen")
    env = container_env(objects, container(qwen, "worker"))
    mounts = {m["name"]: m for m in container(qwen, "worker")["volumeMounts"]}
    assert env["KVRELAY_MODEL"].startswith(mounts["models"]["mountPath"] + "/")
    assert mounts["models"]["readOnly"] is True
    assert env["KVRELAY_MODEL_NAME"] == "qwen2-0.5b"
    smollm2 = worker_named(objects, "smollm2")
    env = container_env(objects, container(smollm2, "worker"))
    [cache] = [m for m in container(smollm2, "worker")["volumeMounts"]
               if m["name"] == "model-cache"]
    assert cache["mountPath"] == env["KVRELAY_CACHE_DIR"]


def test_a_model_path_needs_a_served_name(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="servedModelName"):
        render({"workers": {"smollm2": {"model": "/models/x.gguf"}}}, tmp_path)


def test_scale_to_zero_leaves_replicas_to_keda(tmp_path: Path) -> None:
    objects = render(SCENARIOS["models-from-volumes-scaled-to-zero"], tmp_path)
    for scaled in of_kind(objects, "ScaledObject"):
        assert scaled["spec"]["minReplicaCount"] == 0
        assert scaled["spec"]["maxReplicaCount"] == 8
        target = named(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"]  # KEDA's HPA owns it


def test_without_autoscaling_replicas_are_fixed(tmp_path: Path) -> None:
    objects = render(SCENARIOS["fixed-replicas"], tmp_path)
    assert of_kind(objects, "ScaledObject") == []
    assert of_kind(objects, "TriggerAuthentication") == []
    assert of_kind(objects, "PodDisruptionBudget") == []
    assert [d["spec"]["replicas"] for d in workers(objects)] == [3]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_disruption_budgets_cover_each_model_and_the_gateway(scenario: str,
                                                             tmp_path: Path) -> None:
    objects = render(SCENARIOS[scenario], tmp_path)
    budgets = of_kind(objects, "PodDisruptionBudget")
    for deployment in of_kind(objects, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets
                    if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        if scenario == "fixed-replicas":
            assert covering == []
            continue
        assert len(covering) == 1, deployment["metadata"]["name"]
        assert covering[0]["spec"]["maxUnavailable"] == 1
