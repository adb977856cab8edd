"""``KVRELAY_*`` variables: one table, checked at start, equal to the worker's settings
and to the documentation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvrelay.cli.config import BY_NAME, VARIABLES, validate_environment
from kvrelay.cli.env_cmd import markdown_table
from kvrelay.cli.errors import CliError
from kvrelay.cli.main import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KVRELAY_CONCURRENCY", "many", "KVRELAY_CONCURRENCY must be an integer, got 'many'"),
        ("KVRELAY_CONCURRENCY", "0", "KVRELAY_CONCURRENCY must be at least 1, got '0'"),
        ("KVRELAY_LEASE_TTL", "0", "KVRELAY_LEASE_TTL must be greater than 0, got '0'"),
        ("KVRELAY_METRICS_PORT", "70000", "KVRELAY_METRICS_PORT must be a port number"),
        ("KVRELAY_ENABLE_PREFIX_CACHING", "maybe", "must be true or false, got 'maybe'"),
        ("KVRELAY_DTYPE", "int8", "KVRELAY_DTYPE must be one of auto, float32"),
        ("KVRELAY_REDIS_URL", "localhost:6379", "must be a redis://, rediss://, unix:// or redis+sentinel:// URL"),
        ("KVRELAY_REDIS_URL", "redis+sentinel://h:26379", "names no primary"),
    ],
)
def test_malformed_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(CliError) as caught:
        validate_environment({name: value})
    assert message in caught.value.format_message()


def test_valid_empty_and_test_variables_pass() -> None:
    env = {
        "KVRELAY_CONCURRENCY": "8",
        "KVRELAY_LEASE_TTL": "2.5",
        "KVRELAY_ENABLE_CUDA_GRAPHS": "off",
        "KVRELAY_DTYPE": "bfloat16",
        "KVRELAY_REDIS_URL": "rediss://user:pw@example:6380/2",
        "KVRELAY_MODEL": "",  # empty means unset
        "KVRELAY_TEST_ANYTHING": "x",
        "PATH": "/bin",
    }
    assert validate_environment(env) == []


def test_unknown_variable_suggests_the_close_name() -> None:
    warnings = validate_environment({"KVRELAY_DEVIEC": "cpu"})
    assert warnings == ["unknown variable KVRELAY_DEVIEC is ignored; did you mean KVRELAY_DEVICE?"]


def test_table_covers_every_worker_setting() -> None:
    from kvrelay_worker.settings import WorkerSettings

    fields = {f"KVRELAY_{f.name.upper()}" for f in dataclasses.fields(WorkerSettings)}
    fields.discard("KVRELAY_WORKER_ID")  # generated, never read from the environment
    missing = fields - set(BY_NAME)
    assert not missing, f"add these worker settings to kvrelay/cli/config.py: {sorted(missing)}"


def test_table_defaults_match_the_worker() -> None:
    from kvrelay_worker.settings import WorkerSettings

    defaults = WorkerSettings()
    for field in dataclasses.fields(WorkerSettings):
        variable = BY_NAME.get(f"KVRELAY_{field.name.upper()}")
        value = getattr(defaults, field.name)
        if variable is None or variable.default.startswith("(") or value in (None, ""):
            continue
        if isinstance(value, bool):
            assert variable.default == str(value).lower(), field.name
        else:
            assert (
                float(variable.default) == float(value)
                if isinstance(value, int | float)
                else (variable.default == value)
            ), field.name


def test_docs_hold_the_same_table() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert markdown_table() in page, "regenerate docs/configuration.md's table: kvrelay env --markdown"


def test_env_command_lists_every_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_CONCURRENCY", "7")
    result = CliRunner().invoke(cli, ["env"])
    assert result.exit_code == 0, result.output
    for variable in VARIABLES:
        assert variable.name in result.output
    assert "= 7" in result.output
    markdown = CliRunner().invoke(cli, ["env", "--markdown"])
    assert markdown.output.startswith("| Variable | Default | Used by | Meaning |")
