"""The prefix cache never serves one adapter's KV to another, and shares it within one.

The same prompt runs with adapter ``a``, adapter ``b``, the base model, ``a`` again, and
``a``'s files under a second name: the cache hits only where the weights are the same
(the block hash chains over the adapter's content, as over the cache salt), and every
request's tokens are those of an engine without a prefix cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts
from helpers.lora_adapters import RECIPES, adapter_root, build_adapter

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine
from kvrelay_worker.engine.kv.kv_cache import root_hash

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
(PROMPT,) = random_prompts([40], seed=5)  # two full blocks of 16 can be served
CACHED = 32

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_chain_starts_apart_for_each_adapter() -> None:
    plain = root_hash("m", None)
    assert len({plain, root_hash("m", None, "x"), root_hash("m", None, "y"),
                root_hash("m", "s", "x"), root_hash("m", "s")}) == 5
    assert root_hash("m", None, "x") == root_hash("m", None, "x")


@pytest.fixture(scope="module")
def adapters(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    root = adapter_root(tmp_path_factory)
    return {name: build_adapter(smollm2_folder, RECIPES[name], root)
            for name in ("attn-r8", "rslora-r16")}


def _engine(folder: Path, adapters: dict[str, Path], caching: bool) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32",
                                    max_loras=2, max_lora_rank=16, num_kv_blocks=64,
                                    enable_prefix_caching=caching))
    engine.add_lora("a", adapters["attn-r8"])
    engine.add_lora("b", adapters["rslora-r16"])
    engine.add_lora("a-copy", adapters["attn-r8"])  # the same files under another name
    return engine


def _run(engine: LLMEngine, request_id: str, lora: str | None) -> tuple[list[int], int]:
    """The request's tokens, and the prompt tokens the prefix cache served it."""
    hits = engine.stats()["prefix_cache_hits"]
    engine.add_request(request_id, PROMPT, GREEDY, lora=lora)
    tokens = final_outputs(run_engine(engine))[request_id].choices[0].token_ids
    return tokens, engine.stats()["prefix_cache_hits"] - hits


def test_cache_hits_only_within_an_adapter(smollm2_folder: Path,
                                           adapters: dict[str, Path]) -> None:
    fresh = _engine(smollm2_folder, adapters, caching=False)
    truth = {lora: _run(fresh, f"truth-{lora}", lora)[0] for lora in ("a", "b", None)}
    assert len({tuple(t) for t in truth.values()}) == 3, truth  # three different models
    engine = _engine(smollm2_folder, adapters, caching=True)
    order = [("a", 0), ("b", 0), (None, 0), ("a", CACHED), ("b", CACHED), (None, CACHED),
             ("a-copy", CACHED)]
    for i, (lora, hits) in enumerate(order):
        tokens, served = _run(engine, f"r{i}", lora)
        assert served == hits, (lora, served)
        assert tokens == truth["a" if lora == "a-copy" else lora], lora
    assert_engine_idle(engine)
    assert_engine_idle(fresh)


def test_a_name_loaded_again_with_other_weights_gets_no_stale_blocks(
        smollm2_folder: Path, adapters: dict[str, Path]) -> None:
    engine = _engine(smollm2_folder, adapters, caching=True)
    first, _ = _run(engine, "before", "a")
    engine.add_lora("a", adapters["rslora-r16"])  # "a" now means b's weights
    again, served = _run(engine, "after", "a")
    as_b, served_b = _run(engine, "as-b", "b")
    assert served == 0
    assert again != first
    assert served_b == CACHED  # b's content: the blocks "a" just made
    assert as_b == again
    assert_engine_idle(engine)
