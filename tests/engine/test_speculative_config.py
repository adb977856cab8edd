"""``EngineConfig``'s speculative options: accepted forms, the typed error for every other
value (before any model loads), and ``LLM(..., speculative=...)`` reaching the engine."""

from __future__ import annotations

from typing import Any

import pytest

from kvrelay_worker.engine import LLM, EngineConfig, EngineConfigError


def config(**options: Any) -> EngineConfig:
    return EngineConfig(device="cpu", **options)


def test_defaults_are_off_with_k_4_and_ngrams_2_to_4() -> None:
    c = config()
    assert (c.speculative, c.num_speculative_tokens) == ("off", 4)
    assert (c.speculative_ngram_min, c.speculative_ngram_max) == (2, 4)
    assert (c.speculative_method, c.speculative_draft_model) == ("off", None)


@pytest.mark.parametrize(("value", "method", "draft"), [
    ("off", "off", None),
    ("ngram", "ngram", None),
    (" NGram ", "ngram", None),
    ("draft:smollm2-135m-instruct", "draft", "smollm2-135m-instruct"),
    ("draft:/models/tiny draft/model.gguf", "draft", "/models/tiny draft/model.gguf"),
    ("Draft: C:/m", "draft", "C:/m"),
])
def test_accepted_forms_name_method_and_draft(value: str, method: str,
                                              draft: str | None) -> None:
    c = config(speculative=value)
    assert (c.speculative_method, c.speculative_draft_model) == (method, draft)


@pytest.mark.parametrize(("options", "message"), [
    ({"speculative": "eagle"}, "speculative must be off, ngram or draft:<model name or path>, "
                               "got 'eagle'"),
    ({"speculative": "draft:"}, "names no draft model"),
    ({"speculative": "draft:  "}, "names no draft model"),
    ({"speculative": "ngram:3"}, "got 'ngram:3'"),
    ({"speculative": ""}, "got ''"),
    ({"speculative": None}, "speculative must be a string"),
    ({"speculative": True}, "speculative must be a string"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer from 1 to 16, "
                                    "got 0"),
    ({"num_speculative_tokens": 17}, "got 17"),
    ({"num_speculative_tokens": 2.0}, "got 2.0"),
    ({"num_speculative_tokens": True}, "got True"),
    ({"speculative_ngram_min": 0}, "1 <= min <= max <= 8, got 0 and 4"),
    ({"speculative_ngram_min": 5}, "got 5 and 4"),
    ({"speculative_ngram_max": 9}, "got 2 and 9"),
    ({"speculative_ngram_min": "2"}, "got '2' and 4"),
])
def test_bad_values_raise_the_typed_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineConfigError) as caught:
        config(**options)
    assert message in str(caught.value)


def test_the_limits_themselves_are_accepted() -> None:
    for k in (1, 16):
        assert config(speculative="ngram", num_speculative_tokens=k).num_speculative_tokens == k
    c = config(speculative_ngram_min=1, speculative_ngram_max=8)
    assert (c.speculative_ngram_min, c.speculative_ngram_max) == (1, 8)
    c = config(speculative_ngram_min=3, speculative_ngram_max=3)
    assert (c.speculative_ngram_min, c.speculative_ngram_max) == (3, 3)


def test_llm_refuses_a_bad_setting_before_loading_anything() -> None:
    # The model does not exist: the config's check must come first to be seen.
    with pytest.raises(EngineConfigError, match="got 'fast'"):
        LLM("/nonexistent/model", device="cpu", speculative="fast")
    with pytest.raises(EngineConfigError, match="num_speculative_tokens"):
        LLM("/nonexistent/model", device="cpu", speculative="ngram", num_speculative_tokens=99)


@pytest.mark.usefixtures("one_thread")
def test_llm_keywords_reach_the_engine_config(folder: str) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=2,
              speculative="ngram", num_speculative_tokens=3, speculative_ngram_min=1,
              speculative_ngram_max=5)
    c = llm.engine.config
    assert (c.speculative_method, c.num_speculative_tokens) == ("ngram", 3)
    assert (c.speculative_ngram_min, c.speculative_ngram_max) == (1, 5)
