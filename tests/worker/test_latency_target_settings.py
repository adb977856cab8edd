"""KVRELAY_TARGET_STEP_MS reaches the engine as ``target_step_ms``; bad values stop the
worker before the model loads."""

from __future__ import annotations

import pytest

from kvrelay.cli.config import validate_environment
from kvrelay.cli.errors import CliError
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.settings import SettingsError, WorkerSettings


def test_the_target_becomes_an_engine_option() -> None:
    options = WorkerSettings.from_env({"KVRELAY_TARGET_STEP_MS": "75"}).engine_options()
    assert options["target_step_ms"] == 75.0
    config = EngineConfig(**options)  # type: ignore[arg-type]
    assert config.target_step_ms == 75.0
    assert "target_step_ms" not in WorkerSettings.from_env({}).engine_options()


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "fast"])
def test_bad_targets_are_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="KVRELAY_TARGET_STEP_MS must be"):
        WorkerSettings.from_env({"KVRELAY_TARGET_STEP_MS": value})
    with pytest.raises(CliError, match="KVRELAY_TARGET_STEP_MS"):
        validate_environment({"KVRELAY_TARGET_STEP_MS": value})
