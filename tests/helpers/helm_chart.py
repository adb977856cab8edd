"""The Helm chart (deploy/helm/kvrelay) rendered by the real ``helm template``, and read back
as a kubelet would read it: objects by kind and name, a container's environment with its
Secret references and ``$(VAR)`` expansions resolved, a probe's port by name.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kvrelay"
RELEASE = "kv"
NAMESPACE = "serving"

Obj = dict[str, Any]


def helm_binary() -> str:
    """The helm ``make install`` puts beside this Python (deploy/install_helm.py), else PATH's."""
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file():
        return str(beside)
    found = shutil.which("helm")
    if found is None:
        raise RuntimeError("helm is not installed: run `make install` "
                           "(or python deploy/install_helm.py .venv/bin)")
    return found


def render(values: dict[str, Any] | None, tmp_dir: Path) -> list[Obj]:
    """``helm template`` with ``values`` (a values file) over the chart's defaults."""
    values_file = tmp_dir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values or {}), encoding="utf-8")
    out = subprocess.run(
        [helm_binary(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--values", str(values_file)],
        capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RenderError(out.stderr.strip())
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


class RenderError(RuntimeError):
    """``helm template`` refused the values (the chart's ``fail`` / ``required``)."""


def of_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    [found] = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def container(deployment: Obj, name: str) -> Obj:
    [found] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
               if c["name"] == name]
    return found


def secret_value(objects: list[Obj], name: str, key: str) -> str:
    """A key of a rendered Secret, from ``data`` (base64) or ``stringData``."""
    secret = named(objects, "Secret", name)
    if key in secret.get("stringData", {}):
        return str(secret["stringData"][key])
    return base64.b64decode(secret["data"][key]).decode()


_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(objects: list[Obj], spec: Obj,
                  secrets: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """The container's environment as the kubelet builds it: literal values, Secret keys,
    and ``$(NAME)`` replaced by a variable defined earlier in the list. ``secrets`` stands
    in for Secrets the chart does not render (``existingSecret``: the user's own)."""
    env: dict[str, str] = {}
    for entry in spec.get("env", []):
        if "value" in entry:
            value = str(entry["value"])
            value = _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), value)
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            if secrets is not None and ref["name"] in secrets:
                value = secrets[ref["name"]][ref["key"]]
            else:
                value = secret_value(objects, ref["name"], ref["key"])
        env[entry["name"]] = value
    return env


def workers(objects: list[Obj]) -> list[Obj]:
    """The worker Deployments (one per model entry)."""
    return [o for o in of_kind(objects, "Deployment")
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]


def port_number(spec: Obj, port: int | str) -> int:
    """A probe's or a Service's port: a number, or the name of one of the container's."""
    if isinstance(port, int):
        return port
    [number] = [p["containerPort"] for p in spec["ports"] if p["name"] == port]
    return int(number)
