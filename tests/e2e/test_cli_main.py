"""The ``kvrelay`` command as a whole: help everywhere, one-line errors, no tracebacks."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli_env, one_line_error, run_cli
from click.testing import CliRunner

from kvrelay.cli.main import cli

COMMANDS = [
    [],
    ["up"],
    ["worker"],
    ["generate"],
    ["chat"],
    ["models"],
    ["models", "prepare"],
    ["bench"],
    ["env"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "kvrelay")
def test_every_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: kvrelay" in result.output
    assert "--help" in result.output


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert "kvrelay, version" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["generate"], ("kvrelay generate: error: Missing argument 'PROMPT'",)),
        (["frobnicate"], ("kvrelay: error: No such command 'frobnicate'",)),
        (["up", "--concurrency", "0"], ("kvrelay up: error: Invalid value for '--concurrency'",)),
        (["generate", "hi", "--temperature", "warm"], ("Invalid value for '--temperature'",)),
        (["worker", "--no-such-flag"], ("kvrelay worker: error: No such option", "--no-such-flag")),
    ],
)
def test_usage_mistakes_are_one_line(
    tmp_path: Path, args: list[str], expected: tuple[str, ...]
) -> None:
    result = run_cli(args, cli_env(tmp_path), timeout=60)
    assert result.returncode == 2
    line = one_line_error(result.stderr)
    for fragment in expected:
        assert fragment in line
    assert line.endswith("--help')")
    assert result.stdout == ""


def test_bad_variable_is_one_line_naming_it(tmp_path: Path) -> None:
    env = cli_env(tmp_path, KVRELAY_STREAM_TIMEOUT="soon")
    result = run_cli(["generate", "hi"], env, timeout=60)
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert line == "kvrelay: error: KVRELAY_STREAM_TIMEOUT must be a number, got 'soon'"


def test_unknown_variable_is_a_warning(tmp_path: Path) -> None:
    env = cli_env(tmp_path, KVRELAY_CONCURENCY="4")
    result = run_cli(["bench", "--list", "--benchmarks-dir", str(tmp_path)], env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (
        "kvrelay: warning: unknown variable KVRELAY_CONCURENCY is ignored; "
        "did you mean KVRELAY_CONCURRENCY?" in result.stderr
    )


def test_env_lists_variables_even_when_one_is_wrong(tmp_path: Path) -> None:
    result = run_cli(["env"], cli_env(tmp_path, KVRELAY_CONCURRENCY="lots"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^KVRELAY_CONCURRENCY += lots$", result.stdout, re.M)


def test_python_dash_m_runs_the_same_command(tmp_path: Path) -> None:
    result = run_cli(["--help"], cli_env(tmp_path), timeout=60)
    assert result.returncode == 0
    assert "Commands:" in result.stdout


@pytest.mark.parametrize("command", [["models"], ["up"], ["worker"], ["models", "prepare", "x"]])
def test_missing_worker_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "kvrelay_worker" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 1
    assert "needs the worker package: pip install kvrelay-worker" in result.output
