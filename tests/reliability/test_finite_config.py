"""NaN and infinity are refused wherever a worker or the CLI reads a number.

Every bound check compares, and every comparison with NaN is false: ``LEASE_TTL=nan``
used to start a worker whose every claim raised, and ``inf`` timeouts never end.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kvrelay.cli.config import validate_environment
from kvrelay.cli.errors import CliError
from kvrelay.cli.main import cli
from kvrelay_worker.settings import SettingsError, WorkerSettings

NOT_FINITE = ["nan", "inf", "-inf", "NaN", "Infinity"]
FLOAT_SETTINGS = [f.name for f in dataclasses.fields(WorkerSettings) if "float" in str(f.type)]


def test_the_worker_has_float_settings_to_check() -> None:
    assert {"lease_ttl", "lease_refresh", "shutdown_grace", "gpu_memory_utilization"} <= set(
        FLOAT_SETTINGS)


@pytest.mark.parametrize("raw", NOT_FINITE)
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_worker_settings_refuse_non_finite(name: str, raw: str) -> None:
    variable = f"KVRELAY_{name.upper()}"
    with pytest.raises(SettingsError, match=f"{variable} must be a finite number"):
        WorkerSettings.from_env({variable: raw})


@pytest.mark.parametrize("raw", NOT_FINITE)
@pytest.mark.parametrize("name", [*FLOAT_SETTINGS, "STARTUP_TIMEOUT", "STREAM_TIMEOUT"])
def test_cli_environment_check_refuses_non_finite(name: str, raw: str) -> None:
    variable = f"KVRELAY_{name.upper()}"
    with pytest.raises(CliError) as caught:
        validate_environment({variable: raw})
    assert f"{variable} must be a finite number" in caught.value.format_message()


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--stream-timeout", "nan", "hi"],
        ["generate", "--timeout", "inf", "hi"],
        ["generate", "--temperature", "nan", "hi"],
        ["up", "--startup-timeout", "nan"],
        ["worker", "--shutdown-grace", "inf"],
    ],
)
def test_cli_flags_refuse_non_finite(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args, env={"KVRELAY_REDIS_URL": "redis://localhost:1/0"})
    assert result.exit_code == 2, result.output
    assert "is not a finite number" in result.output


def test_a_worker_process_with_a_nan_lease_does_not_start() -> None:
    """The real ``celery -A kvrelay_worker.app worker`` exits naming the variable."""
    env = {**os.environ, "KVRELAY_LEASE_TTL": "nan", "KVRELAY_DEVICE": "cpu",
           "KVRELAY_REDIS_URL": "redis://localhost:1/0"}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "kvrelay_worker.app", "worker", "--pool",
         "threads", "--loglevel", "INFO"],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "KVRELAY_LEASE_TTL must be a finite number" in done.stdout + done.stderr
