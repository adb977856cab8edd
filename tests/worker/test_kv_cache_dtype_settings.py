"""KVRELAY_KV_CACHE_DTYPE reaches the engine, and a bad value stops the worker before the
model loads."""

from __future__ import annotations

import pytest

from kvrelay.cli.config import validate_environment
from kvrelay.cli.errors import CliError
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.settings import SettingsError, WorkerSettings


def test_the_setting_becomes_an_engine_option() -> None:
    options = WorkerSettings.from_env({"KVRELAY_KV_CACHE_DTYPE": "int8"}).engine_options()
    assert options["kv_cache_dtype"] == "int8"
    config = EngineConfig(**{**options, "device": "cpu"})  # type: ignore[arg-type]
    assert config.kv_cache_dtype == "int8"
    assert "kv_cache_dtype" not in WorkerSettings.from_env({}).engine_options()


def test_a_bad_value_is_refused() -> None:
    env = {"KVRELAY_KV_CACHE_DTYPE": "int4"}
    with pytest.raises(SettingsError, match="KVRELAY_KV_CACHE_DTYPE must be one of"):
        WorkerSettings.from_env(env)
    with pytest.raises(CliError, match="KVRELAY_KV_CACHE_DTYPE"):
        validate_environment(env)
