"""The quantized KV cache in the engine, on the tiny random MQA model (head size 64).

- int8 rows of 64 values plus a 1-byte scale give 256 / 65 = 3.94x the float32 blocks.
- Greedy tokens stay close to the float cache's: teacher-forced, on the float run's own
  token sequences, the int8 cache's next-token choice agrees at >= 95% of the 48
  positions (measured: 48 of 48). The bar leaves room for two flips: a random model's
  logits are nearly flat, so a near-tie may flip under a perturbation of the size the
  kernel tests bound. Free-running, one early flip changes the rest of that output, so
  the bar is half the tokens (measured: all of them).
- Preemption (swap and recompute), copy-on-write and prefix-cache hits move or reuse
  quantized blocks with their scales: the tokens equal a run without any of them exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.loading import load_model_source
from kvrelay_worker.models.factory import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_TOKENS = 16
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
_loaded: dict[str, Any] = {}


def _model(folder: str) -> tuple[Any, Any]:
    if folder not in _loaded:
        files = load_model_source(folder)
        model = build_model(files.config, files.weights(), torch.float32, torch.device("cpu"),
                            max_position=files.config.max_position_embeddings)
        _loaded[folder] = (model, files.tokenizer)
    return _loaded[folder]


def _llm(folder: str, **options: Any) -> LLM:
    model, tokenizer = _model(folder)
    config = EngineConfig(model="llama-mqa", device="cpu", dtype="float32", **options)
    return LLM.from_engine(LLMEngine.from_model(config, model, tokenizer,
                                                model_id="llama-mqa"))


def _tokens(llm: LLM, prompts: list[list[int]],
            params: SamplingParams = GREEDY) -> list[list[int]]:
    outputs = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "blocks leaked"
    return [out.token_ids for out in outputs]


def test_int8_block_count_follows_the_row_bytes(folder: str) -> None:
    memory = 8 << 20
    full = _llm(folder, kv_cache_memory=memory).engine.stats()["total_blocks"]
    engine = _llm(folder, kv_cache_memory=memory, kv_cache_dtype="int8").engine
    blocks = engine.stats()["total_blocks"]
    # A float32 row is 64 * 4 = 256 bytes; an int8 row 64 values + 1 scale byte = 65.
    assert blocks / full >= 3.9
    layers, kv_heads = engine.model.config.num_hidden_layers, engine.model.config.num_key_value_heads
    assert blocks == memory // (layers * 2 * 16 * kv_heads * 65)  # K and V, 16 slots a block


def test_int8_teacher_forced_agreement_with_float(folder: str) -> None:
    """Each position's greedy choice, given the float run's sequence so far, under int8.

    Prompt + float output is fed back as a prompt to both caches with max_tokens=1 at
    every cut point would cost a run per position; instead each cut is one request of a
    single batch: the prompt up to position i, one new token each.
    """
    prompts = random_prompts([20, 45, 80], seed=5)
    float_llm = _llm(folder, num_kv_blocks=256)
    int8_llm = _llm(folder, num_kv_blocks=256, kv_cache_dtype="int8")
    float_out = _tokens(float_llm, prompts)
    cuts = [prompt + out[:i] for prompt, out in zip(prompts, float_out, strict=True)
            for i in range(NEW_TOKENS)]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    forced = [t[0] for t in _tokens(int8_llm, cuts, one)]
    expected = [out[i] for out in float_out for i in range(NEW_TOKENS)]
    agree = sum(a == b for a, b in zip(forced, expected, strict=True)) / len(expected)
    assert agree >= 0.95, f"teacher-forced agreement {agree:.3f}"
    # Free-running, an early flip changes everything after it; still most tokens match.
    free = _tokens(int8_llm, prompts)
    same = sum(a == b for f, g in zip(free, float_out, strict=True)
               for a, b in zip(f, g, strict=True)) / (len(prompts) * NEW_TOKENS)
    assert same >= 0.5, f"free-running agreement {same:.3f}"


@pytest.mark.parametrize(("mode", "kv_cache_dtype"),
                         [("swap", "int8"), ("recompute", "int8"), ("swap", "fp8_e4m3")])
def test_quantized_preemption_is_exact(folder: str, mode: str, kv_cache_dtype: str) -> None:
    """Swap restores the very bytes (values and scales); recompute writes the same ones."""
    prompts = random_prompts([7, 33, 64, 129, 150], seed=11)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    roomy = _tokens(_llm(folder, num_kv_blocks=256, kv_cache_dtype=kv_cache_dtype), prompts,
                    params)
    # 20 blocks of 16 = 320 slots for 583 tokens of work: preemption must happen.
    llm = _llm(folder, num_kv_blocks=20, max_model_len=320, preemption_mode=mode,
               num_swap_blocks=64 if mode == "swap" else None, kv_cache_dtype=kv_cache_dtype)
    assert _tokens(llm, prompts, params) == roomy
    stats = llm.engine.stats()
    assert stats["preemptions"] > 0
    if mode == "swap":
        assert stats["swaps_out"] > 0


def test_int8_prefix_cache_hit_equals_miss(folder: str) -> None:
    shared = random_prompts([70], seed=21)[0]
    tails = random_prompts([9, 17], seed=22)
    prompts = [shared + tail for tail in tails]
    miss = _tokens(_llm(folder, num_kv_blocks=128, kv_cache_dtype="int8",
                        enable_prefix_caching=False), prompts)
    llm = _llm(folder, num_kv_blocks=128, kv_cache_dtype="int8")
    first = _tokens(llm, prompts[:1])
    second = _tokens(llm, prompts[1:])
    assert llm.engine.stats()["prefix_cache_hits"] > 0
    assert first + second == miss


def test_int8_beam_search_runs_on_forked_blocks(folder: str) -> None:
    """Beams fork by sharing blocks and copy the partial last one (``copy_blocks``, whose
    byte-exact copy of quantized blocks ``test_kv_copies_quantized`` checks)."""
    prompts = random_prompts([30], seed=31)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, beam_width=3,
                            n=3)
    llm = _llm(folder, num_kv_blocks=64, kv_cache_dtype="int8")
    choices = llm.generate(prompts, params)[0].choices
    assert len(choices) == 3
    assert len({tuple(c.token_ids) for c in choices}) == 3
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]


def test_unknown_kv_cache_dtype_is_a_config_error() -> None:
    with pytest.raises(EngineConfigError, match="kv_cache_dtype"):
        EngineConfig(device="cpu", kv_cache_dtype="int4")


def test_llm_accepts_kv_cache_dtype(tiny_model: Callable[[str], Path]) -> None:
    llm = LLM(str(tiny_model("llama-mqa")), device="cpu", kv_cache_dtype="int8",
              num_kv_blocks=32)
    assert llm.engine.runner.kv_caches[0].dtype == torch.int8
    assert llm.engine.runner.kv_caches[0].shape[-1] == 65
