"""A draft model's KV pool is paid from the same budget as the target's, at its dtype.

The draft's pool has as many blocks as the target's (every target sequence has a shadow
in it). Before, the target's pool took the whole budget and the draft allocated a second
pool on top (a self-draft doubled the KV memory: on a GPU, past ``gpu_memory_utilization``
and out of memory), and the draft's cache ignored ``kv_cache_dtype``.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.runner.model_runner import kv_bytes_per_block

pytestmark = pytest.mark.usefixtures("one_thread")

BUDGET = 4 << 20


def _bytes(caches: list[torch.Tensor]) -> int:
    return sum(c.numel() * c.element_size() for c in caches)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_target_and_draft_pools_fit_the_budget_together(folder: str,
                                                        kv_cache_dtype: str) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", kv_cache_memory=BUDGET,
              kv_cache_dtype=kv_cache_dtype, speculative=f"draft:{folder}")
    engine = llm.engine
    assert engine.speculator is not None
    draft = engine.speculator.draft
    assert draft is not None
    target_bytes = _bytes(engine.runner.kv_caches)
    draft_bytes = _bytes(draft.runner.kv_caches)
    assert draft.kv.num_blocks == engine.kv.num_blocks
    assert target_bytes + draft_bytes <= BUDGET
    # Sized together, not halved blindly: at most one block of each is left unused.
    per_block = 2 * kv_bytes_per_block(engine.model, engine.config.block_size,
                                       engine.config.torch_kv_cache_dtype)
    assert BUDGET - (target_bytes + draft_bytes) < per_block


def test_the_draft_cache_follows_kv_cache_dtype(folder: str) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompt = [[100 + (i % 7) for i in range(40)]]
    off = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
              kv_cache_dtype="int8").generate(prompt, params)
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64, kv_cache_dtype="int8",
              speculative=f"draft:{folder}", speculative_adaptive=False)
    draft = llm.engine.speculator.draft if llm.engine.speculator else None
    assert draft is not None
    assert {c.dtype for c in draft.runner.kv_caches} == {torch.int8}
    on = llm.generate(prompt, params)
    assert llm.engine.stats()["spec_accepted_tokens"] > 0
    assert on[0].token_ids == off[0].token_ids
