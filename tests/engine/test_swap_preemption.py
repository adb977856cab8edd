"""Swap preemption: greedy outputs stay Hugging Face transformers' under every preemption
mode, with a KV pool small enough that sequences are preempted; swapped sequences resume
with their computed tokens (never re-prefilled), a full host pool falls back to
recompute, a sliding-window model swaps only its live blocks, aborting swapped sequences
frees their host blocks, and ``auto`` chooses by its cost model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_reference import hf_greedy, load_hf_model, random_prompts

from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.sched.preemption import PreemptionPolicy, SwapCostModel
from kvrelay_worker.loading import load_model_source
from kvrelay_worker.models.factory import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_TOKENS = 24
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)

_cache: dict[str, tuple[Any, Any, list[list[int]], list[list[int]]]] = {}


def _prompts(seed: int) -> list[list[int]]:
    prompts = random_prompts([7, 33, 64, 129, 150], seed=seed)
    # Two prompts share 128 tokens, so swap-in must keep the prefix cache right.
    prompts.append(prompts[3][:128] + random_prompts([40], seed=seed + 1)[0])
    return prompts


def _reference(name: str, folder: Path) -> tuple[Any, Any, list[list[int]], list[list[int]]]:
    if name not in _cache:
        files = load_model_source(str(folder))
        model = build_model(files.config, files.weights(), torch.float32, torch.device("cpu"),
                            max_position=files.config.max_position_embeddings)
        prompts = _prompts(seed=len(name))
        _cache[name] = (model, files.tokenizer, prompts,
                        hf_greedy(load_hf_model(folder), prompts, NEW_TOKENS))
    return _cache[name]


def _engine(name: str, folder: Path, **options: Any) -> tuple[LLMEngine, list[list[int]],
                                                              list[list[int]]]:
    model, tokenizer, prompts, expected = _reference(name, folder)
    config = EngineConfig(model=name, device="cpu", dtype="float32", **options)
    return LLMEngine.from_model(config, model, tokenizer, model_id=name), prompts, expected


def _check_all_free(engine: LLMEngine) -> dict[str, Any]:
    stats = engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "device blocks leaked"
    assert stats["free_swap_blocks"] == stats["total_swap_blocks"], "host blocks leaked"
    assert stats["swapped"] == 0
    assert stats["preemptions"] == stats["swaps_out"] + stats["recomputes"]
    return stats


# 20 blocks of 16 = 320 tokens for ~680 tokens of work: preemption must happen.
SMALL_POOL = {"num_kv_blocks": 20, "max_model_len": 320}


@pytest.mark.parametrize(("mode", "host_blocks"),
                         [("swap", 64), ("recompute", None), ("auto", 64), ("swap", 3)])
def test_greedy_matches_transformers(mode: str, host_blocks: int | None,
                                     tiny_model: Callable[[str], Path]) -> None:
    engine, prompts, expected = _engine("llama-mqa", tiny_model("llama-mqa"),
                                        preemption_mode=mode, num_swap_blocks=host_blocks,
                                        **SMALL_POOL)
    outputs = LLM.from_engine(engine).generate(prompts, GREEDY)
    for prompt, out, want in zip(prompts, outputs, expected, strict=True):
        assert out.token_ids == want, f"prompt of {len(prompt)} tokens diverged"
    stats = _check_all_free(engine)
    assert stats["preemptions"] > 0
    if mode == "recompute":
        assert stats["recomputes"] > 0
        assert stats["swaps_out"] == 0
        assert stats["total_swap_blocks"] == 0, "recompute alone needs no host pool"
    elif host_blocks == 3:  # too small for most victims: they are recomputed instead
        assert stats["recomputes"] > 0
    else:
        # The tiny model's KV is small against its compute: auto swaps too.
        assert stats["swaps_out"] > 0
        assert stats["swaps_in"] == stats["swaps_out"]
        assert stats["recomputes"] == 0


def test_windowed_swap_restores_released_entries(tiny_model: Callable[[str], Path]) -> None:
    # A pool of 6 blocks (the window plus a 16-token chunk, and slack): sequences are
    # swapped out with entries already released behind the window.
    engine, prompts, expected = _engine("mistral-window", tiny_model("mistral-window"),
                                        preemption_mode="swap", num_swap_blocks=16,
                                        num_kv_blocks=6, max_num_batched_tokens=16)
    assert engine.kv.sliding_window == 32
    released_at_swap: list[int] = []
    live_at_swap: list[int] = []
    detach = engine.kv.detach_for_swap

    def spy(seq: Any) -> tuple[list[int], int]:
        live, released = detach(seq)
        live_at_swap.append(len(live))
        released_at_swap.append(released)
        return live, released

    engine.kv.detach_for_swap = spy  # type: ignore[method-assign]
    outputs = LLM.from_engine(engine).generate(prompts, GREEDY)
    for prompt, out, want in zip(prompts, outputs, expected, strict=True):
        assert out.token_ids == want, f"prompt of {len(prompt)} tokens diverged"
    stats = _check_all_free(engine)
    assert stats["swaps_out"] > 0
    assert max(released_at_swap) > 0, "no swapped sequence had released blocks"
    # Only live blocks travel: never more than the window, a 16-token chunk and slack.
    assert max(live_at_swap) <= -(-(32 + 16) // 16) + 1


def test_abort_frees_swapped_sequences(tiny_model: Callable[[str], Path]) -> None:
    engine, prompts, _ = _engine("llama-mqa", tiny_model("llama-mqa"),
                                 preemption_mode="swap", num_swap_blocks=64, **SMALL_POOL)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    for _ in range(200):
        engine.step()
        if engine.stats()["swapped"]:
            break
    stats = engine.stats()
    assert stats["swapped"] > 0
    assert stats["free_swap_blocks"] < stats["total_swap_blocks"]
    swapped = [seq for seq in engine.scheduler.waiting_sequences() if seq.num_computed_tokens]
    assert swapped, "a swapped sequence keeps its computed tokens while it waits"
    for i in range(len(prompts)):
        engine.abort_request(f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    _check_all_free(engine)


def test_auto_chooses_by_cost() -> None:
    # 1000 tokens/s prefill, 1 MB/s copies of 1 kB blocks: a block costs 2 ms to swap
    # out and back, a token 1 ms to recompute.
    cost = SwapCostModel(bytes_per_block=1000, prefill_tokens_per_s=1000.0,
                         copy_bytes_per_s=1e6)
    policy = PreemptionPolicy("auto", cost)
    assert policy.wants_swap(recompute_tokens=48, swap_blocks=3)
    assert not policy.wants_swap(recompute_tokens=5, swap_blocks=3)
    assert not policy.wants_swap(recompute_tokens=0, swap_blocks=0)
    assert PreemptionPolicy("swap").wants_swap(0, 10)
    assert not PreemptionPolicy("recompute").wants_swap(10**6, 1)


@pytest.mark.parametrize(("options", "message"), [
    ({"preemption_mode": "spill"}, "preemption_mode must be one of"),
    ({"swap_space_gib": -1.0}, "swap_space_gib must be"),
    ({"swap_space_gib": float("nan")}, "swap_space_gib must be"),
    ({"num_swap_blocks": -1}, "num_swap_blocks must be at least 0"),
    ({"preemption_mode": "swap", "swap_space_gib": 0.0}, "needs host memory"),
    ({"preemption_mode": "swap", "num_swap_blocks": 0}, "needs host memory"),
])
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        EngineConfig(device="cpu", **options)
