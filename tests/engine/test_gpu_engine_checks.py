"""What only a GPU run can show about the engine's other paths (skipped without CUDA).

benchmarks/gpu_check.sh runs these in its engine stage, beside test_gpu_engine.py:

- speculation (n-gram, and a self-draft) with CUDA graphs on gives the tokens of
  speculation off, in float32;
- int8 and int4 weights on the GPU (the Triton GEMM) give the CPU's tokens (its loop);
- a sequence swapped out to host memory and back decodes as one never preempted;
- beam search, whose beams share blocks and copy a shared partial block on write, gives
  the CPU's beams.

Two float32 runs of one model on different kernels may still part where the top two
logits are closer than rounding: a differing greedy token is accepted only where the
reference run's top-2 log-probabilities were within ``NEAR_TIE`` (the margin is printed).

``KVRELAY_GPU_CHECK_DEVICE=cpu`` runs every check with the CPU on both sides: a rehearsal
of the checks' own logic on a machine without a GPU (not a check of the GPU).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, RequestOutput, SamplingParams

DEVICE = os.environ.get("KVRELAY_GPU_CHECK_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                       reason="needs CUDA"),
]

NEAR_TIE = 1e-4
MODEL = "qwen2-gqa-bias-tied"
PROMPTS = random_prompts([5, 17, 40, 100, 150, 300], seed=21)
# A repeating prompt gives the n-gram proposer something to find.
PROMPTS.append([100 + (i % 7) for i in range(48)])
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, logprobs=2)
SMALL = {"dtype": "float32", "num_kv_blocks": 256, "max_num_seqs": 8,
         "cuda_graph_max_batch": 8}


@pytest.fixture(autouse=True)
def _free_gpu_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _generate(folder: Path, device: str, params: SamplingParams = GREEDY, rounds: int = 1,
              **options: Any) -> tuple[list[RequestOutput], dict[str, Any]]:
    """The last of ``rounds`` runs of ``PROMPTS`` through one engine."""
    llm = LLM(str(folder), device=device, **{**SMALL, **options})
    for _ in range(rounds):
        outputs = llm.generate(PROMPTS, params)
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "blocks leaked"
    return outputs, stats


def assert_same_but_near_ties(reference: list[RequestOutput], other: list[RequestOutput],
                              what: str) -> None:
    """Token for token equal, except that a run may part at a near tie of the reference."""
    flips = []
    for number, (ref, got) in enumerate(zip(reference, other, strict=True)):
        a, b = ref.token_ids, got.token_ids
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            assert len(a) == len(b), f"{what}: prompt {number} ended at another length"
            continue
        assert ref.logprobs is not None, "the reference run must carry logprobs"
        top = ref.logprobs[first].top
        margin = top[0][1] - top[1][1]
        flips.append((number, first, margin))
        assert margin < NEAR_TIE, (
            f"{what}: prompt {number} parts at token {first} where the reference's top two "
            f"were {margin:.2e} apart (a near tie is < {NEAR_TIE})")
    print(f"[gpu-check] {what}: {len(flips)} near-tie flips {flips}")


@pytest.mark.parametrize("method", ["ngram", "self-draft"])
def test_speculation_with_graphs_equals_speculation_off(
        method: str, tiny_model: Callable[[str], Path]) -> None:
    folder = tiny_model(MODEL)
    # A random model seldom repeats itself, so the n-gram proposer is fed by the index of
    # recent outputs: the prompts' second round finds the first round's answers there.
    off, _ = _generate(folder, DEVICE, rounds=2, enable_cuda_graphs=True)
    speculative = ({"speculative": "ngram", "speculative_ngram_min": 1} if method == "ngram"
                   else {"speculative": f"draft:{folder}"})
    on, stats = _generate(folder, DEVICE, rounds=2, enable_cuda_graphs=True,
                          speculative_adaptive=False, **speculative)
    assert stats["spec_verify_steps"] > 0, "nothing was speculated"
    if method == "self-draft":
        assert stats["spec_accepted_tokens"] > 0
    assert_same_but_near_ties(off, on, f"speculation {method} vs off")


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_weights_on_the_gpu_equal_the_cpu(
        quantization: str, tiny_model: Callable[[str], Path]) -> None:
    folder = tiny_model(MODEL)
    cpu, _ = _generate(folder, "cpu", quantization=quantization)
    gpu, _ = _generate(folder, DEVICE, quantization=quantization)
    assert_same_but_near_ties(cpu, gpu, f"{quantization} weights, {DEVICE} vs cpu")


def test_swapped_sequences_decode_as_never_preempted(
        tiny_model: Callable[[str], Path]) -> None:
    """A pool of 24 blocks for ~700 tokens of work: sequences go to host memory and back."""
    folder = tiny_model(MODEL)
    whole, _ = _generate(folder, DEVICE)
    swapped, stats = _generate(folder, DEVICE, num_kv_blocks=24, max_model_len=384,
                               preemption_mode="swap", num_swap_blocks=128)
    assert stats["swaps_out"] > 0, "nothing was swapped"
    assert stats["swaps_in"] == stats["swaps_out"]
    assert stats["free_swap_blocks"] == stats["total_swap_blocks"], "host blocks leaked"
    assert_same_but_near_ties(whole, swapped, "swap out and in")


def test_beam_search_on_the_gpu_equals_the_cpu(tiny_model: Callable[[str], Path]) -> None:
    """Beams share their prompt's blocks and copy a shared partial block on write."""
    folder = tiny_model(MODEL)
    params = SamplingParams(beam_width=4, n=4, max_tokens=12, ignore_eos=True)
    cpu, _ = _generate(folder, "cpu", params)
    gpu, _ = _generate(folder, DEVICE, params)
    for number, (c, g) in enumerate(zip(cpu, gpu, strict=True)):
        assert [x.token_ids for x in c.choices] == [x.token_ids for x in g.choices], \
            f"prompt {number}: other beams"
        for x, y in zip(c.choices, g.choices, strict=True):
            assert x.beam_score is not None
            assert y.beam_score is not None
            assert y.beam_score == pytest.approx(x.beam_score, abs=1e-3)
