"""Requests over several LoRA adapters and the base model share steps without mixing.

Sixteen greedy requests over four adapters and the base model run together: the first
step holds all sixteen prompts (five distinct row slots: -1 and four adapters), every
later step decodes all sixteen, and each request gets exactly the tokens it gets when it
runs alone. The same holds when prompts are chunked and the KV pool is so small that
sequences are preempted (swapped out and back, or recomputed) along the way. Every
block is free afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts
from helpers.lora_adapters import RECIPES, adapter_root, build_adapter

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine
from kvrelay_worker.engine.runner.host_batch import HostBatch

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
LORAS: list[str | None] = [None, *RECIPES]  # the base model and four adapters
PROMPTS = random_prompts([3 + 4 * i for i in range(16)], seed=11)
REQUESTS = [(f"req-{i}", prompt, LORAS[i % len(LORAS)]) for i, prompt in enumerate(PROMPTS)]

pytestmark = pytest.mark.usefixtures("one_thread")

_alone: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def adapters(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    root = adapter_root(tmp_path_factory)
    return {name: build_adapter(smollm2_folder, recipe, root)
            for name, recipe in RECIPES.items()}


def _engine(folder: Path, adapters: dict[str, Path], **options: Any) -> LLMEngine:
    config = EngineConfig(model=str(folder), device="cpu", dtype="float32", max_loras=4,
                          max_lora_rank=64, **{"num_kv_blocks": 128, **options})
    engine = LLMEngine(config)
    for name, path in adapters.items():
        engine.add_lora(name, path)
    return engine


@pytest.fixture(scope="module")
def alone(smollm2_folder: Path, adapters: dict[str, Path]) -> dict[str, list[int]]:
    """Each request's tokens when it is the only one (prefix caching off: nothing shared)."""
    if not _alone:
        engine = _engine(smollm2_folder, adapters, enable_prefix_caching=False)
        for request_id, prompt, lora in REQUESTS:
            engine.add_request(request_id, prompt, GREEDY, lora=lora)
            finals = final_outputs(run_engine(engine))
            _alone[request_id] = finals[request_id].choices[0].token_ids
        assert_engine_idle(engine)
    return _alone


def _record_batches(engine: LLMEngine) -> list[HostBatch]:
    """Every step's host batch, as the model runner builds it."""
    seen: list[HostBatch] = []
    prepare = engine.runner.prepare_host

    def recording(*args: Any, **kwargs: Any) -> HostBatch:
        host = prepare(*args, **kwargs)
        seen.append(host)
        return host

    engine.runner.prepare_host = recording  # type: ignore[method-assign]
    return seen


def test_sixteen_requests_over_four_adapters_in_one_step(
        smollm2_folder: Path, adapters: dict[str, Path], alone: dict[str, list[int]]) -> None:
    engine = _engine(smollm2_folder, adapters, max_num_batched_tokens=1024)
    batches = _record_batches(engine)
    for request_id, prompt, lora in REQUESTS:
        engine.add_request(request_id, prompt, GREEDY, lora=lora)
    finals = final_outputs(run_engine(engine))
    first = batches[0]
    assert first.num_seqs == 16
    assert first.input_ids.numel() == sum(map(len, PROMPTS))
    assert first.lora_slots is not None
    assert sorted(set(first.lora_slots.tolist())) == [-1, 0, 1, 2, 3]
    # Each prompt's tokens carry its own request's slot.
    per_seq = torch.split(first.lora_slots, [len(p) for p in PROMPTS])
    names = {info.slot: info.name for info in engine.list_loras()}
    for (_, _, lora), slots in zip(REQUESTS, per_seq, strict=True):
        assert set(slots.tolist()) == {-1 if lora is None else next(
            s for s, n in names.items() if n == lora)}
    assert [b.num_seqs for b in batches] == [16] * GREEDY.max_tokens  # type: ignore[operator]
    assert {rid: out.choices[0].token_ids for rid, out in finals.items()} == alone
    assert_engine_idle(engine)


@pytest.mark.parametrize("options", [
    {"max_num_batched_tokens": 48, "num_kv_blocks": 20, "preemption_mode": "swap",
     "num_swap_blocks": 64},
    {"max_num_batched_tokens": 48, "num_kv_blocks": 20, "preemption_mode": "recompute"},
], ids=["chunked-swapped", "chunked-recomputed"])
def test_chunked_and_preempted_adapter_requests_match_alone(
        smollm2_folder: Path, adapters: dict[str, Path], alone: dict[str, list[int]],
        options: dict[str, Any]) -> None:
    engine = _engine(smollm2_folder, adapters, **options)
    for request_id, prompt, lora in REQUESTS:
        engine.add_request(request_id, prompt, GREEDY, lora=lora)
    finals = final_outputs(run_engine(engine))
    assert engine.stats()["preemptions"] > 0
    assert {rid: out.choices[0].token_ids for rid, out in finals.items()} == alone
    assert_engine_idle(engine)
