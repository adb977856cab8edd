"""The chart's KEDA objects against KEDA's own definitions (v2.20.2, fixtures in data/keda):
the ScaledObject and TriggerAuthentication CRD schemas, the metadata its Redis list
scaler reads, and the Redis keys it counts, which must be the ones kvrelay's workers and
clients use (``kvrelay.keys.Keyspace``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers.chart_values import SCENARIOS
from helpers.helm_chart import (
    Obj,
    container,
    container_env,
    named,
    of_kind,
    render,
    workers,
)

from kvrelay.keys import Keyspace

DATA = Path(__file__).parent / "data" / "keda"
SCALER = json.loads((DATA / "redis-scaler.json").read_text(encoding="utf-8"))
SCALED = sorted(name for name in SCENARIOS if name != "fixed-replicas")  # it has no KEDA
# The user's own Secret in the Sentinel scenario (``redis.auth.existingSecret``).
USER_SECRETS = {"redis-credentials": {"url": "redis+sentinel://s0:26379,s1:26379/kvrelay/0",
                                      "password": "pw"}}


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as ``kubectl apply --validate=strict`` does:
    every object that lists its properties allows no others."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_errors(obj: Obj) -> list[str]:
    name = {"ScaledObject": "scaledobject", "TriggerAuthentication": "triggerauthentication"}
    schema = json.loads((DATA / f"{name[obj['kind']]}.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(strict(schema))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)]


def keda_objects(objects: list[Obj]) -> list[Obj]:
    return of_kind(objects, "ScaledObject") + of_kind(objects, "TriggerAuthentication")


@pytest.mark.parametrize("scenario", SCALED)
def test_keda_objects_match_the_crd_schemas(scenario: str, tmp_path: Path) -> None:
    objects = render(SCENARIOS[scenario], tmp_path)
    assert of_kind(objects, "ScaledObject")
    for obj in keda_objects(objects):
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert crd_errors(obj) == [], obj["metadata"]["name"]


def test_the_crd_check_catches_mistakes(tmp_path: Path) -> None:
    scaled = copy.deepcopy(of_kind(render({}, tmp_path), "ScaledObject")[0])
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")  # HPA's name
    scaled["spec"]["triggers"][0]["authenticationRef"]["kind"] = "Secret"
    errors = crd_errors(scaled)
    assert any("minReplicas" in e for e in errors), errors
    assert any("authenticationRef/kind" in e for e in errors), errors


def test_replica_bounds_keep_the_crd_rule(tmp_path: Path) -> None:
    """The CRD's one CEL rule (jsonschema cannot run CEL): min <= max (100 when unset)."""
    schema = json.loads((DATA / "scaledobject.schema.json").read_text(encoding="utf-8"))
    [rule] = schema["properties"]["spec"]["x-kubernetes-validations"]
    assert "self.minReplicaCount <= (has(self.maxReplicaCount) ? self.maxReplicaCount : 100)" \
        in rule["rule"]
    for scenario in SCALED:
        for scaled in of_kind(render(SCENARIOS[scenario], tmp_path), "ScaledObject"):
            assert 0 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


def metadata_problems(trigger: Obj) -> list[str]:
    """What KEDA's Redis list scaler would refuse or ignore in ``trigger``."""
    problems = []
    if trigger["type"] not in SCALER["trigger_types"]:
        problems.append(f"trigger type {trigger['type']}")
    known = SCALER["metadata"]
    accepted = set(known) | {f"{k}FromEnv" for k, v in known.items() if v.get("from_env")}
    metadata: dict[str, str] = trigger["metadata"]
    problems += [f"unknown key {key}" for key in sorted(set(metadata) - accepted)]
    problems += [f"missing {key}" for key, spec in known.items()
                 if spec.get("required") and key not in metadata]
    if not any(all(key in metadata for key in group) for group in SCALER["address_one_of"]):
        problems.append("no address")
    for key, value in metadata.items():
        kind = known.get(key, {}).get("type")
        if kind == "integer" and not value.lstrip("-").isdigit():
            problems.append(f"{key}={value!r} is not an integer")
        if kind == "boolean" and value.lower() not in ("true", "false", "1", "0"):
            problems.append(f"{key}={value!r} is not a boolean")
    if trigger["type"] == "redis-sentinel" and "sentinelMaster" not in metadata:
        problems.append("redis-sentinel without sentinelMaster")
    return problems


@pytest.mark.parametrize("scenario", SCALED)
def test_redis_triggers_use_only_what_the_scaler_reads(scenario: str, tmp_path: Path) -> None:
    objects = render(SCENARIOS[scenario], tmp_path)
    for scaled in of_kind(objects, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            assert metadata_problems(trigger) == [], scaled["metadata"]["name"]


def test_the_metadata_check_catches_mistakes(tmp_path: Path) -> None:
    trigger = copy.deepcopy(of_kind(render({}, tmp_path), "ScaledObject")[0]["spec"]["triggers"][0])
    trigger["metadata"]["listname"] = trigger["metadata"].pop("listName")
    trigger["metadata"]["listLength"] = "many"
    del trigger["metadata"]["address"]
    assert metadata_problems(trigger) == [
        "unknown key listname", "missing listName", "no address",
        "listLength='many' is not an integer"]


@pytest.mark.parametrize("scenario", SCALED)
def test_triggers_count_the_keys_the_workers_use(scenario: str, tmp_path: Path) -> None:
    """listName is the model's queue (and its running-jobs set), as Keyspace names them
    for the namespace and served model the worker's own settings resolve to."""
    from kvrelay_worker.settings import WorkerSettings

    objects = render(SCENARIOS[scenario], tmp_path)
    for scaled in of_kind(objects, "ScaledObject"):
        deployment = named(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        env = container_env(objects, container(deployment, "worker"), USER_SECRETS)
        settings = WorkerSettings.from_env({k: v for k, v in env.items()
                                            if k.startswith("KVRELAY_")})
        keys = Keyspace(settings.namespace)
        names = {t["name"]: t["metadata"]["listName"] for t in scaled["spec"]["triggers"]}
        assert names == {"queue": keys.queue(settings.served_model),
                         "running": keys.running_jobs(settings.served_model)}
        by_name = {t["name"]: t["metadata"] for t in scaled["spec"]["triggers"]}
        assert by_name["running"]["listLength"] == str(settings.concurrency)


def test_a_tenants_queue_is_under_its_prefix(tmp_path: Path) -> None:
    objects = render(SCENARIOS["gpu-and-cpu-of-a-tenant"], tmp_path)
    names = {t["metadata"]["listName"] for s in of_kind(objects, "ScaledObject")
             for t in s["spec"]["triggers"]}
    assert names == {"kvrelay:ns:team-a:queue:smollm2-135m-instruct",
                     "kvrelay:ns:team-a:running:smollm2-135m-instruct"}


def test_keda_authenticates_with_the_password_the_workers_use(tmp_path: Path) -> None:
    objects = render({}, tmp_path)
    [auth] = of_kind(objects, "TriggerAuthentication")
    [ref] = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] == "password"
    for scaled in of_kind(objects, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
            # KEDA runs in its own namespace: it needs the Service's namespaced name.
            assert trigger["metadata"]["address"] == "kv-kvrelay-redis.serving.svc:6379"
    deployment = workers(objects)[0]
    url = container_env(objects, container(deployment, "worker"))["KVRELAY_REDIS_URL"]
    password = container_env(objects, {"env": [
        {"name": "P", "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}}}]})
    assert f":{password['P']}@kv-kvrelay-redis:6379/0" in url
    assert len(password["P"]) >= 32


def test_sentinel_redis_uses_the_sentinel_trigger(tmp_path: Path) -> None:
    objects = render(SCENARIOS["sentinel-redis"], tmp_path)
    [auth] = of_kind(objects, "TriggerAuthentication")
    assert {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]} == {
        "password": "password", "username": "username", "sentinelPassword": "sentinel-password"}
    assert {r["name"] for r in auth["spec"]["secretTargetRef"]} == {"redis-credentials"}
    for trigger in of_kind(objects, "ScaledObject")[0]["spec"]["triggers"]:
        assert trigger["type"] == "redis-sentinel"
        assert trigger["metadata"]["addresses"] == "sentinel-0.data:26379,sentinel-1.data:26379"
        assert trigger["metadata"]["sentinelMaster"] == "kvrelay"
        assert trigger["metadata"]["enableTLS"] == "true"


def test_no_password_no_trigger_authentication(tmp_path: Path) -> None:
    objects = render(SCENARIOS["external-redis-without-password"], tmp_path)
    assert of_kind(objects, "TriggerAuthentication") == []
    for trigger in of_kind(objects, "ScaledObject")[0]["spec"]["triggers"]:
        assert "authenticationRef" not in trigger
