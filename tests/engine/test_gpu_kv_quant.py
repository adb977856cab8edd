"""The quantized KV cache on CUDA: the Triton store and attention inside the engine
(skipped without CUDA; not yet run on a GPU when written).

- Triton against the references on the same GPU, float32 weights: the store writes the
  same bytes (the kernel tests check that bit for bit), so only the attention's summation
  order differs; greedy tokens must agree on at least 90% of the prompts (a random
  model's near-ties may flip one; the figure is printed).
- Decode replayed from CUDA graphs gives exactly the tokens of eager decode.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = random_prompts([1, 5, 16, 17, 40, 64, 100, 150, 200, 255], seed=17)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
KV_DTYPES = ["int8", "fp8_e4m3"]


@pytest.fixture(autouse=True)
def _free_gpu_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _tokens(folder: Path, kv_cache_dtype: str, *, graphs: bool) -> list[list[int]]:
    llm = LLM(str(folder), device="cuda", dtype="float32", kv_cache_dtype=kv_cache_dtype,
              num_kv_blocks=512, enable_cuda_graphs=graphs)
    return [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_triton_tracks_the_reference_on_quantized_kv(
        kv_cache_dtype: str, tiny_model: Callable[[str], Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tiny_model("llama-mqa")
    triton = _tokens(folder, kv_cache_dtype, graphs=False)
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    reference = _tokens(folder, kv_cache_dtype, graphs=False)
    same = sum(a == b for a, b in zip(triton, reference, strict=True)) / len(PROMPTS)
    print(f"[gpu-report] {kv_cache_dtype} KV, Triton vs reference: {same:.0%} of prompts")
    assert same >= 0.9


@pytest.mark.parametrize("kv_cache_dtype", KV_DTYPES)
def test_cuda_graphs_replay_quantized_decode_exactly(
        kv_cache_dtype: str, tiny_model: Callable[[str], Path]) -> None:
    folder = tiny_model("llama-mqa")
    assert _tokens(folder, kv_cache_dtype, graphs=True) == _tokens(folder, kv_cache_dtype,
                                                                   graphs=False)
