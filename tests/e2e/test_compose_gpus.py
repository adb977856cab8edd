"""``kvrelay compose --gpus``: an override that, merged over compose.yaml as Compose merges
files, still matches the Compose schema and runs one worker per GPU, each a copy of
compose.yaml's worker with its own GPU and metrics port."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from test_compose import schema_errors

from kvrelay.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"


def generate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["compose", "--compose-file", str(COMPOSE), *args])
    return result.exit_code, result.output


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge for what the override holds: mappings merge key by key, the rest
    (lists, scalars) is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    code, text = generate("--gpus", "2,0,3")
    assert code == 0, text
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def test_the_merged_file_matches_the_compose_schema(base: dict[str, Any],
                                                    override: dict[str, Any]) -> None:
    assert schema_errors(override) == []
    assert schema_errors(merged(base, override)) == []


def test_one_worker_per_gpu(base: dict[str, Any], override: dict[str, Any]) -> None:
    services = merged(base, override)["services"]
    gpu_workers = {name: s for name, s in services.items()
                   if s.get("image") == "kvrelay-worker:latest" and "profiles" not in s}
    assert set(gpu_workers) == {"worker", "worker-gpu0", "worker-gpu3"}
    visible = sorted(s["environment"]["CUDA_VISIBLE_DEVICES"] for s in gpu_workers.values())
    assert visible == ["0", "2", "3"]
    assert services["worker"]["environment"]["CUDA_VISIBLE_DEVICES"] == "2"  # the first
    ports = [port for s in gpu_workers.values() for port in s["ports"]]
    host_ports = {port.rsplit(":", 1)[0] for port in ports}
    assert len(host_ports) == 3, ports  # no two workers publish the same host port


def test_each_copy_is_compose_yamls_worker(base: dict[str, Any],
                                           override: dict[str, Any]) -> None:
    worker = base["services"]["worker"]
    for name in ("worker-gpu0", "worker-gpu3"):
        copy_ = override["services"][name]
        assert {k: v for k, v in copy_.items() if k != "ports"} == {
            **{k: v for k, v in worker.items() if k != "ports"},
            "environment": {**worker["environment"],
                            "CUDA_VISIBLE_DEVICES": name.removeprefix("worker-gpu")}}


def test_written_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "compose.gpus.yaml"
    code, text = generate("--gpus", "0,1", "--output", str(out))
    assert code == 0, text
    assert f"docker compose -f {COMPOSE} -f {out} up -d" in text
    assert "worker-gpu1:" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("gpus", ["0,0", "a,1", "-1", ""])
def test_refuses_bad_gpu_lists(gpus: str) -> None:
    code, text = generate("--gpus", gpus)
    assert code != 0
    assert "--gpus" in text


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="no docker-compose here")
def test_docker_compose_reads_the_pair(tmp_path: Path) -> None:
    """Compose's own reading of both files (no engine needed)."""
    out = tmp_path / "compose.gpus.yaml"
    assert generate("--gpus", "0,1", "--output", str(out))[0] == 0
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE), "-f", str(out), "config",
                           "--services"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "KVRELAY_MODELS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert {"worker", "worker-gpu1"} <= set(done.stdout.split())
