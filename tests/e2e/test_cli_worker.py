"""``kvrelay worker``: flags become the worker's settings, mistakes are one line, and the
real thing serves jobs and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import (
    CLI_DB,
    background_cli,
    cli_env,
    live_models,
    one_line_error,
    run_cli,
    wait_no_leftovers,
)
from click.testing import CliRunner
from helpers.redis_db import fresh_db_url

from kvrelay.cli.main import cli


def test_dry_run_shows_variables_and_command(tmp_path: Path) -> None:
    args = ["worker", "--dry-run", "--model", "smollm2-135m-instruct", "--device", "cpu",
            "--concurrency", "3", "--redis-url", "redis://example:6379/4", "--events"]  # fmt: skip
    result = CliRunner().invoke(cli, args, env={"KVRELAY_MAX_NUM_SEQS": "2"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "KVRELAY_DEVICE=cpu" in lines
    assert "KVRELAY_CONCURRENCY=3" in lines
    assert "KVRELAY_REDIS_URL=redis://example:6379/4" in lines
    assert "KVRELAY_MAX_NUM_SEQS=2" in lines  # variables without a flag pass through
    command = lines[-1]
    assert " -m celery -A kvrelay_worker.app worker --pool threads --concurrency 3 " in command
    assert "--queues kvrelay:queue:smollm2-135m-instruct" in command
    # The pid makes the default node name unique per process (exec keeps it).
    assert f"--hostname kvrelay-smollm2-135m-instruct-{os.getpid()}@%h" in command
    assert command.endswith("--task-events")


@pytest.mark.parametrize("how", ["variable", "flag"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "BFloat16"])
def test_short_dtype_names_work_as_flag_and_variable(dtype: str, how: str) -> None:
    args = ["worker", "--dry-run", "--device", "cpu"]
    env = {"KVRELAY_DTYPE": dtype} if how == "variable" else {}
    if how == "flag":
        args += ["--dtype", dtype]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert any(line.lower() == f"kvrelay_dtype={dtype.lower()}"
               for line in result.output.splitlines()), result.output


def test_model_path_serves_under_its_name(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    result = CliRunner().invoke(cli, ["worker", "--dry-run", "--model", str(folder)])
    assert result.exit_code == 0, result.output
    assert f"KVRELAY_MODEL={folder}" in result.output
    assert "--queues kvrelay:queue:my-model" in result.output


def test_simulated_model_needs_no_files(tmp_path: Path) -> None:
    """``--model simulated[:name]`` starts the simulated engine: nothing to find or prepare."""
    result = run_cli(["worker", "--dry-run", "--model", "simulated:llama-8b"],
                     cli_env(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "KVRELAY_MODEL=simulated:llama-8b" in result.stdout
    assert "--queues kvrelay:queue:simulated:llama-8b" in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--model", "no-such-model"], {}, "unknown model 'no-such-model'"),
        ([], {"KVRELAY_LEASE_REFRESH": "9"}, "KVRELAY_LEASE_REFRESH (9.0) must be shorter"),
        ([], {"KVRELAY_CONCURRENCY": "lots"}, "KVRELAY_CONCURRENCY must be an integer"),
        (["--device", "tpu"], {}, "KVRELAY_DEVICE must be auto, cpu or cuda"),
    ],
)
def test_mistakes_are_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    result = run_cli(["worker", "--dry-run", *args], cli_env(tmp_path, **env), timeout=60)
    assert result.returncode == 1
    assert message in one_line_error(result.stderr)


@pytest.mark.integration
def test_worker_serves_and_stops_on_sigterm(
    tmp_path: Path, redis_url: str, tiny_model: Callable[[str], Path]
) -> None:
    url = fresh_db_url(redis_url, CLI_DB)
    model = tiny_model("llama-mqa")
    env = cli_env(tmp_path)
    args = ["worker", "--model", str(model), "--device", "cpu", "--concurrency", "2",
            "--redis-url", url, "--shutdown-grace", "2"]  # fmt: skip
    with background_cli(args, env, tmp_path / "worker") as worker:
        worker.wait_for(lambda: "llama-mqa" in live_models(url), 180, "the worker's heartbeat")
        result = run_cli(
            ["generate", "Hi", "--json", "--max-tokens", "4", "--temperature", "0",
             "--redis-url", url],
            env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["model"] == "llama-mqa"
        assert answer["usage"]["completion_tokens"] >= 1
        worker.send(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.stderr
        assert "kvrelay worker stopped" in worker.stderr
    assert wait_no_leftovers(env["KVRELAY_TEST_MARKER"]) == []
