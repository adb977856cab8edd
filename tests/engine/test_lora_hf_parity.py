"""Greedy output with a LoRA adapter equals PEFT's merged model in transformers, token for token.

Adapters made by ``peft`` on SmolLM2's float32 weights with random non-zero B: rank 8 on
attention only, rank 16 on the MLP only, rank 64 on all seven projections, and an
rsLoRA one (``lora_alpha / sqrt(r)``). Each runs 8 prompts together in one engine, its
reference is ``merge_and_unload`` then ``generate``. The engine serves them from slots
of rank 64 (q|k|v split over two kernel calls); the rsLoRA one also from slots of rank
16 (q|k|v in one call), so both layouts of the fused projections are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import hf_greedy, random_prompts
from helpers.lora_adapters import RECIPES, adapter_root, build_adapter, merged_model

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine

PROMPT_LENGTHS = [1, 6, 13, 17, 32, 45, 64, 97]
NEW_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("one_thread")

_references: dict[str, list[list[int]]] = {}
_base_tokens: list[list[int]] = []  # the base model's, once (the same in every engine)
# What each engine layout serves: every adapter at rank 64, the rsLoRA one at rank 16.
SERVED = {64: set(RECIPES), 16: {"rslora-r16"}}


@pytest.fixture(scope="module")
def adapters(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    root = adapter_root(tmp_path_factory)
    return {name: build_adapter(smollm2_folder, recipe, root)
            for name, recipe in RECIPES.items()}


@pytest.fixture(scope="module")
def engines(smollm2_folder: Path, adapters: dict[str, Path]
            ) -> Iterator[Callable[[int], LLMEngine]]:
    """``engines(max_rank)``: one engine per slot width, built on first use, serving the
    adapters ``SERVED`` lists for it."""
    built: dict[int, LLMEngine] = {}

    def get(max_rank: int) -> LLMEngine:
        if max_rank not in built:
            config = EngineConfig(model=str(smollm2_folder), device="cpu", dtype="float32",
                                  max_loras=2, max_lora_rank=max_rank, num_kv_blocks=128)
            built[max_rank] = LLMEngine(config)
            for name in SERVED[max_rank]:
                built[max_rank].add_lora(name, adapters[name])
        return built[max_rank]

    yield get
    for engine in built.values():
        assert_engine_idle(engine)


def _greedy(engine: LLMEngine, prompts: list[list[int]], lora: str | None) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{lora}-{i}", prompt, GREEDY, lora=lora)
    finals = final_outputs(run_engine(engine))
    return [finals[f"{lora}-{i}"].choices[0].token_ids for i in range(len(prompts))]


def _reference(name: str, base: Path, adapter: Path, prompts: list[list[int]]
               ) -> list[list[int]]:
    if name not in _references:
        _references[name] = hf_greedy(merged_model(base, adapter), prompts, NEW_TOKENS)
    return _references[name]


@pytest.mark.parametrize(("max_rank", "name"), [
    (rank, name) for rank, names in SERVED.items() for name in sorted(names)])
def test_greedy_equals_peft_merged_model(engines: Callable[[int], LLMEngine], max_rank: int,
                                         name: str, smollm2_folder: Path,
                                         adapters: dict[str, Path]) -> None:
    engine = engines(max_rank)
    prompts = random_prompts(PROMPT_LENGTHS, seed=7)
    ours = _greedy(engine, prompts, name)
    assert ours == _reference(name, smollm2_folder, adapters[name], prompts)
    if not _base_tokens:
        _base_tokens.extend(_greedy(engine, prompts, None))
    base = _base_tokens
    # The adapter changes what the model says (a zero B would pass the check above).
    assert sum(a != b for a, b in zip(ours, base, strict=True)) >= 6
    assert_engine_idle(engine)
