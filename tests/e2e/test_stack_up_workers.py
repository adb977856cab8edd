"""``kvrelay up --workers N`` and ``--gpus 0,1``: several worker processes in one local
stack, each with its own device and Celery node name, all ready before the question and
all stopped at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import cli_env, one_line_error, run_cli, wait_no_leftovers

from kvrelay.cli.errors import CliError
from kvrelay.cli.worker_launch import worker_plans

TINY = "llama-mqa"


@pytest.fixture
def env(tiny_model: Callable[[str], Path]) -> dict[str, str]:
    return {"KVRELAY_MODEL": str(tiny_model(TINY)), "KVRELAY_CONCURRENCY": "2"}


def _devices(plans: list) -> list[str | None]:
    return [plan.env.get("KVRELAY_DEVICE") for plan in plans]


def _node_names(plans: list) -> list[str]:
    return [plan.argv[plan.argv.index("--hostname") + 1] for plan in plans]


def test_one_worker_per_gpu(env: dict[str, str]) -> None:
    plans = worker_plans(env, 1, (2, 0))
    assert _devices(plans) == ["cuda:2", "cuda:0"]
    assert len(set(_node_names(plans))) == 2


def test_workers_per_gpu_and_per_device(env: dict[str, str]) -> None:
    assert _devices(worker_plans(env, 2, (0, 1))) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    three = worker_plans({**env, "KVRELAY_DEVICE": "cpu"}, 3)
    assert _devices(three) == ["cpu"] * 3
    assert len(set(_node_names(three))) == 3
    assert len(worker_plans(env)) == 1


def test_several_workers_cannot_share_a_metrics_port(env: dict[str, str]) -> None:
    with pytest.raises(CliError, match="cannot share metrics port 9400"):
        worker_plans({**env, "KVRELAY_METRICS_PORT": "9400"}, 2)
    assert len(worker_plans({**env, "KVRELAY_METRICS_PORT": "0"}, 2)) == 2


def test_gpus_and_device_together_are_refused(tmp_path: Path,
                                              tiny_model: Callable[[str], Path]) -> None:
    args = ["up", "--model", str(tiny_model(TINY)), "--gpus", "0,1", "--device", "cpu"]
    result = run_cli(args, cli_env(tmp_path), timeout=60)
    assert result.returncode == 2
    assert "--gpus sets each worker's device" in one_line_error(result.stderr)


@pytest.mark.integration
def test_two_workers_answer_then_stop(tmp_path: Path,
                                      tiny_model: Callable[[str], Path]) -> None:
    env = cli_env(tmp_path)
    args = ["up", "Hello there", "--model", str(tiny_model(TINY)), "--device", "cpu",
            "--concurrency", "2", "--workers", "2", "--max-tokens", "4"]
    result = run_cli(args, env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "2 workers ready in" in result.stderr  # two heartbeats, from two processes
    assert "Stopped." in result.stderr
    assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []
    assert list(tmp_path.glob("kvrelay-up-*")) == []
