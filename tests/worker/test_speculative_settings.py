"""KVRELAY_SPECULATIVE, KVRELAY_SPECULATIVE_TOKENS and KVRELAY_SPECULATIVE_NGRAM reach the
engine's config; bad values stop the worker at start, naming the variable."""

from __future__ import annotations

import pytest

from kvrelay.cli.config import validate_environment
from kvrelay.cli.errors import CliError
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.settings import SettingsError, WorkerSettings


def engine_config(env: dict[str, str]) -> EngineConfig:
    options = WorkerSettings.from_env({"KVRELAY_DEVICE": "cpu", **env}).engine_options()
    return EngineConfig(**options)  # type: ignore[arg-type]


def test_unset_the_engine_defaults_apply() -> None:
    c = engine_config({})
    assert (c.speculative_method, c.num_speculative_tokens) == ("off", 4)
    assert (c.speculative_ngram_min, c.speculative_ngram_max) == (2, 4)
    assert WorkerSettings.from_env({}).speculative_summary == "off"


@pytest.mark.parametrize(("env", "expected", "summary"), [
    ({"KVRELAY_SPECULATIVE": "ngram"}, ("ngram", None, 4, 2, 4), "ngram (k=4, n=2-4)"),
    ({"KVRELAY_SPECULATIVE": "ngram", "KVRELAY_SPECULATIVE_TOKENS": "8",
      "KVRELAY_SPECULATIVE_NGRAM": "1-6"}, ("ngram", None, 8, 1, 6), "ngram (k=8, n=1-6)"),
    ({"KVRELAY_SPECULATIVE": "ngram", "KVRELAY_SPECULATIVE_NGRAM": " 3 "},
     ("ngram", None, 4, 3, 3), "ngram (k=4, n=3-3)"),
    ({"KVRELAY_SPECULATIVE": "draft:/m/draft.gguf", "KVRELAY_SPECULATIVE_TOKENS": "16"},
     ("draft", "/m/draft.gguf", 16, 2, 4), "draft:/m/draft.gguf (k=16)"),
    ({"KVRELAY_SPECULATIVE": "off", "KVRELAY_SPECULATIVE_NGRAM": "8-8"},
     ("off", None, 4, 8, 8), "off"),
])
def test_the_variables_become_engine_options(env: dict[str, str],
                                             expected: tuple[object, ...], summary: str) -> None:
    c = engine_config(env)
    assert (c.speculative_method, c.speculative_draft_model, c.num_speculative_tokens,
            c.speculative_ngram_min, c.speculative_ngram_max) == expected
    assert WorkerSettings.from_env(env).speculative_summary == summary


@pytest.mark.parametrize(("name", "value", "message"), [
    ("KVRELAY_SPECULATIVE", "medusa", "KVRELAY_SPECULATIVE must be off, ngram or "
                                      "draft:<model name or path>, got 'medusa'"),
    ("KVRELAY_SPECULATIVE", "draft:", "KVRELAY_SPECULATIVE 'draft:' names no draft model"),
    ("KVRELAY_SPECULATIVE", "on", "got 'on'"),
    ("KVRELAY_SPECULATIVE_TOKENS", "0", "KVRELAY_SPECULATIVE_TOKENS must be an integer from "
                                        "1 to 16, got 0"),
    ("KVRELAY_SPECULATIVE_TOKENS", "17", "got 17"),
    ("KVRELAY_SPECULATIVE_TOKENS", "four", "KVRELAY_SPECULATIVE_TOKENS must be int, got 'four'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "4-2", "KVRELAY_SPECULATIVE_NGRAM must be MIN-MAX (e.g. 2-4) "
                                         "or one number, with 1 <= MIN <= MAX <= 8, got '4-2'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "0", "got '0'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "2-9", "got '2-9'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "2-3-4", "got '2-3-4'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "2..4", "got '2..4'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "-3", "got '-3'"),
    ("KVRELAY_SPECULATIVE_NGRAM", "\u00b2", "got '\u00b2'"),
])
def test_bad_values_stop_the_worker_naming_the_variable(name: str, value: str,
                                                         message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env({name: value})
    assert message in str(caught.value)


@pytest.mark.parametrize(("name", "value"), [("KVRELAY_SPECULATIVE_TOKENS", "0"),
                                             ("KVRELAY_SPECULATIVE_TOKENS", "x")])
def test_the_cli_checks_the_count_before_starting_anything(name: str, value: str) -> None:
    with pytest.raises(CliError, match=name):
        validate_environment({name: value})
