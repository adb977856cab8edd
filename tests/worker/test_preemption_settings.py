"""The worker's preemption settings reach the engine, and bad values stop it before the
model loads."""

from __future__ import annotations

import pytest

from kvrelay.cli.config import validate_environment
from kvrelay.cli.errors import CliError
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.settings import SettingsError, WorkerSettings


def test_settings_become_engine_options() -> None:
    settings = WorkerSettings.from_env({"KVRELAY_PREEMPTION_MODE": "recompute",
                                        "KVRELAY_SWAP_SPACE_GIB": "0.25"})
    options = settings.engine_options()
    assert options["preemption_mode"] == "recompute"
    assert options["swap_space_gib"] == 0.25
    config = EngineConfig(**options)  # type: ignore[arg-type]
    assert (config.preemption_mode, config.swap_space_gib) == ("recompute", 0.25)
    defaults = WorkerSettings.from_env({}).engine_options()
    assert "preemption_mode" not in defaults
    assert "swap_space_gib" not in defaults


@pytest.mark.parametrize(("variable", "value", "match"), [
    ("KVRELAY_PREEMPTION_MODE", "evict", "KVRELAY_PREEMPTION_MODE must be one of"),
    ("KVRELAY_SWAP_SPACE_GIB", "-1", "KVRELAY_SWAP_SPACE_GIB must be >= 0"),
])
def test_bad_values_are_refused(variable: str, value: str, match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        WorkerSettings.from_env({variable: value})
    with pytest.raises(CliError, match=variable):
        validate_environment({variable: value})
