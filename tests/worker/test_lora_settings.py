"""KVRELAY_LORA_MODULES, KVRELAY_MAX_LORAS and KVRELAY_MAX_LORA_RANK reach the engine's
config; bad values stop the worker at start, naming the variable."""

from __future__ import annotations

import pytest

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.settings import SettingsError, WorkerSettings


def engine_config(env: dict[str, str]) -> EngineConfig:
    options = WorkerSettings.from_env({"KVRELAY_DEVICE": "cpu", **env}).engine_options()
    return EngineConfig(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "slots", "rank"), [
    ({}, 0, 16),  # LoRA off: it costs nothing
    ({"KVRELAY_LORA_MODULES": "a=/x,b=/y"}, 2, 16),  # one slot per adapter named
    ({"KVRELAY_LORA_MODULES": "a=/x", "KVRELAY_MAX_LORAS": "4"}, 4, 16),
    ({"KVRELAY_MAX_LORAS": "3", "KVRELAY_MAX_LORA_RANK": "64"}, 3, 64),
])
def test_the_variables_become_engine_options(env: dict[str, str], slots: int,
                                             rank: int) -> None:
    config = engine_config(env)
    assert (config.max_loras, config.max_lora_rank) == (slots, rank)


def test_modules_are_read_as_name_path_pairs() -> None:
    settings = WorkerSettings.from_env({"KVRELAY_LORA_MODULES": "tone=/a/tone, style=~/s"})
    assert settings.lora_module_list == [("tone", "/a/tone"), ("style", "~/s")]


@pytest.mark.parametrize(("env", "message"), [
    ({"KVRELAY_LORA_MODULES": "tone"}, "KVRELAY_LORA_MODULES: expected 'name=path'"),
    ({"KVRELAY_LORA_MODULES": "a b=/x"}, "an adapter name is 1 to 128"),
    ({"KVRELAY_LORA_MODULES": "a=/x,a=/y"}, "names adapter 'a' twice"),
    ({"KVRELAY_LORA_MODULES": "a=/x,b=/y", "KVRELAY_MAX_LORAS": "1"},
     "KVRELAY_MAX_LORAS (1) must be at least the number of KVRELAY_LORA_MODULES (2)"),
    ({"KVRELAY_MAX_LORAS": "-1"}, "KVRELAY_MAX_LORAS (-1) must be at least"),
    ({"KVRELAY_MAX_LORAS": "two"}, "KVRELAY_MAX_LORAS must be int"),
    ({"KVRELAY_MAX_LORA_RANK": "0"}, "KVRELAY_MAX_LORA_RANK must be 1 to 64, got 0"),
    ({"KVRELAY_MAX_LORA_RANK": "65"}, "got 65"),
    ({"KVRELAY_MODEL": "simulated", "KVRELAY_LORA_MODULES": "a=/x"},
     "the simulated engine has no LoRA support"),
])
def test_bad_values_stop_the_worker_naming_the_variable(env: dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env(env)
    assert message in str(caught.value)
