"""Speculative decoding, structured output and beam search keep working with an adapter.

The oracle is an engine on PEFT's merged model saved as a plain model folder: the base
engine with the adapter must give exactly its tokens, feature for feature. Proposers
ignore adapters (n-gram lookup reads tokens; the draft model is the tiny random
``llama-mqa``, which knows nothing of the adapter and so proposes drafts the target
mostly rejects); verification runs with the request's adapter, so every draft the target
keeps is one the adapted model would have chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.lora_adapters import RECIPES, adapter_root, build_adapter, merged_folder

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine

ADAPTER = "rslora-r16"
TEXT = ("The cat sat on the mat. The cat sat on the mat. The dog sat on the log. "
        "The dog sat on the log. The cat")
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}
SCHEMA = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog", "bird"]},
                                           "count": {"type": "integer"}},
          "required": ["animal", "count"], "additionalProperties": False}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, Path]:
    """(the adapter, the merged model's folder)."""
    root = adapter_root(tmp_path_factory)
    adapter = build_adapter(smollm2_folder, RECIPES[ADAPTER], root)
    return adapter, merged_folder(smollm2_folder, adapter, root)


def _tokens(folder: Path, params: SamplingParams, lora_folder: Path | None = None,
            **options: Any) -> tuple[list[list[int]], dict[str, Any]]:
    """Every choice's tokens for ``TEXT`` (and the engine's stats), with the adapter when
    ``lora_folder`` is given."""
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32",
                                    num_kv_blocks=64, max_lora_rank=16,
                                    max_loras=1 if lora_folder else 0, **options))
    if lora_folder is not None:
        engine.add_lora("adapter", lora_folder)
    engine.add_request("r", TEXT, params, lora="adapter" if lora_folder else None)
    out = final_outputs(run_engine(engine))["r"]
    assert_engine_idle(engine)
    return [choice.token_ids for choice in out.choices], engine.stats()


def _merged_and_adapted(smollm2_folder: Path, folders: tuple[Path, Path],
                        params: SamplingParams, **options: Any
                        ) -> tuple[list[list[int]], list[list[int]], dict[str, Any]]:
    adapter, merged = folders
    expected, _ = _tokens(merged, params)
    got, stats = _tokens(smollm2_folder, params, adapter, **options)
    plain, _ = _tokens(smollm2_folder, params)
    assert plain != expected  # the adapter matters for this prompt
    return expected, got, stats


@pytest.mark.parametrize("speculative", [
    lambda tiny: {"speculative": "ngram", "speculative_ngram_min": 1},
    lambda tiny: {"speculative": f"draft:{tiny('llama-mqa')}", "num_speculative_tokens": 3},
], ids=["ngram", "draft-model"])
def test_speculative_decoding_verifies_with_the_adapter(
        smollm2_folder: Path, folders: tuple[Path, Path],
        tiny_model: Callable[[str], Path],
        speculative: Callable[[Callable[[str], Path]], dict[str, Any]]) -> None:
    options = {**speculative(tiny_model), "speculative_adaptive": False}
    expected, got, stats = _merged_and_adapted(smollm2_folder, folders,
                                               SamplingParams(**GREEDY), **options)
    assert got == expected
    assert stats["spec_proposed_tokens"] > 0


def test_structured_output_with_the_adapter(smollm2_folder: Path,
                                            folders: tuple[Path, Path]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}
    params = SamplingParams(**{**GREEDY, "ignore_eos": False},
                            response_format=fmt)  # type: ignore[arg-type]
    expected, got, _ = _merged_and_adapted(smollm2_folder, folders, params)
    assert got == expected


def test_beam_search_with_the_adapter(smollm2_folder: Path,
                                      folders: tuple[Path, Path]) -> None:
    params = SamplingParams(beam_width=3, n=2, max_tokens=10, ignore_eos=True)
    expected, got, _ = _merged_and_adapted(smollm2_folder, folders, params)
    assert got == expected
    assert len(got) == 2
