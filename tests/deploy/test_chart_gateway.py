"""The gateway's objects: a Service onto the port the container listens on, API keys and
the admin key from Secrets (never in the pod spec), a budget, probes that leave a Redis
outage to readiness alone."""

from __future__ import annotations

from pathlib import Path

from helpers.chart_values import SCENARIOS
from helpers.helm_chart import Obj, container, container_env, named, port_number, render

GATEWAY = "kv-kvrelay-gateway"


def gateway(objects: list[Obj]) -> Obj:
    return container(named(objects, "Deployment", GATEWAY), "gateway")


def test_service_reaches_the_port_the_gateway_listens_on(tmp_path: Path) -> None:
    objects = render({"gateway": {"port": 8123}}, tmp_path)
    spec = gateway(objects)
    command = spec["command"]
    assert command[:2] == ["kvrelay", "gateway"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    listens = int(command[command.index("--port") + 1])
    service = named(objects, "Service", GATEWAY)
    [port] = service["spec"]["ports"]
    assert port_number(spec, port["targetPort"]) == listens == 8123
    pod_labels = named(objects, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_probes_readiness_on_health_liveness_on_the_port(tmp_path: Path) -> None:
    spec = gateway(render({}, tmp_path))
    assert spec["readinessProbe"]["httpGet"]["path"] == "/health"  # reaches Redis
    assert "httpGet" not in spec["livenessProbe"]  # a Redis outage restarts no gateway
    assert port_number(spec, spec["livenessProbe"]["tcpSocket"]["port"]) == 8000


def test_api_keys_come_from_a_secret_file(tmp_path: Path) -> None:
    objects = render(SCENARIOS["gpu-and-cpu-of-a-tenant"], tmp_path)
    spec = gateway(objects)
    env = container_env(objects, spec, {"gateway-admin": {"admin-key": "the-admin-key"}})
    keys_file = Path(env["KVRELAY_GATEWAY_API_KEYS_FILE"])
    [mount] = [m for m in spec["volumeMounts"] if m["mountPath"] == str(keys_file.parent)]
    assert mount["readOnly"] is True
    pod = named(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = named(objects, "Secret", volume["secret"]["secretName"])
    [item] = volume["secret"]["items"]
    assert item["path"] == keys_file.name
    assert secret["stringData"][item["key"]].split() == ["sk-alice=alice", "sk-bob=bob"]
    assert env["KVRELAY_GATEWAY_ADMIN_KEY"] == "the-admin-key"
    assert env["KVRELAY_NAMESPACE"] == "team-a"
    assert "sk-alice" not in str(named(objects, "Deployment", GATEWAY))


def test_an_existing_keys_secret_is_mounted_not_made(tmp_path: Path) -> None:
    objects = render({"gateway": {"apiKeys": {"existingSecret": "my-keys"}}}, tmp_path)
    pod = named(objects, "Deployment", GATEWAY)["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == ["my-keys"]
    assert [s["metadata"]["name"] for s in objects if s["kind"] == "Secret"] == \
        ["kv-kvrelay-redis"]


def test_no_keys_no_keys_file(tmp_path: Path) -> None:
    env = container_env(objects := render({}, tmp_path), gateway(objects))
    assert "KVRELAY_GATEWAY_API_KEYS_FILE" not in env


def test_a_gateway_only_image(tmp_path: Path) -> None:
    values = {"gateway": {"image": {"repository": "kvrelay-gateway"}}}
    assert gateway(render(values, tmp_path))["image"] == "kvrelay-gateway:latest"
