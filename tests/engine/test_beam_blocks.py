"""Beams share blocks: a fork takes references, and only a write into a shared partial
block copies it (copy-on-write); every block returns to the pool at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine_run import assert_engine_idle

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sched.sequence import Sequence

pytestmark = pytest.mark.usefixtures("one_thread")

BS = 16


def _seq(num_tokens: int) -> Sequence:
    params = SamplingParams(beam_width=2, max_tokens=4)
    return Sequence(request_id="r", choice_index=0, token_ids=list(range(num_tokens)),
                    num_prompt_tokens=num_tokens, params=params)


def _computed(kv: KVCacheManager, num_tokens: int) -> Sequence:
    seq = _seq(num_tokens)
    assert kv.allocate_slots(seq, num_tokens)
    seq.num_computed_tokens = num_tokens
    return seq


def test_a_write_into_a_shared_partial_block_copies_it_once() -> None:
    kv = KVCacheManager(8, BS, enable_caching=False, model_id="m")
    parent = _computed(kv, 20)  # one full block, one with 4 tokens
    child = _seq(0)
    kv.share_blocks([child], [parent])
    child.num_computed_tokens = 20
    assert list(child.block_table) == list(parent.block_table)
    assert kv.num_free_blocks == 6
    assert kv.allocate_slots(child, 1)
    (copy,) = kv.take_copies()
    assert copy == (parent.block_table[1], child.block_table[1])
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert kv.allocate_slots(parent, 1)  # its partial block is its own again: no copy
    assert kv.take_copies() == []
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 8


def test_a_fork_at_a_block_boundary_copies_nothing() -> None:
    kv = KVCacheManager(8, BS, enable_caching=False, model_id="m")
    parent = _computed(kv, 32)
    child = _seq(0)
    kv.share_blocks([child], [parent])
    child.num_computed_tokens = 32
    assert kv.allocate_slots(child, 1)
    assert kv.take_copies() == []
    assert kv.num_copies_on_write == 0


def test_four_beams_hold_far_fewer_blocks_than_four_sequences(smollm2_folder: Path) -> None:
    llm = LLM(str(smollm2_folder), device="cpu", dtype="float32", num_kv_blocks=64)
    engine = llm.engine
    prompt = list(range(1000, 1040))  # 2 full blocks and 8 tokens
    engine.add_request("beams", prompt, SamplingParams(beam_width=4, max_tokens=8,
                                                       ignore_eos=True))
    used: list[int] = []
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        used.append(stats["total_blocks"] - stats["free_blocks"])
    one_sequence = -(-(len(prompt) + 8) // BS)  # 3 blocks
    # Shared: the 2 full prompt blocks; each beam's own: its last (partial) block.
    assert max(used) <= 2 + 4 < 4 * one_sequence
    assert engine.kv.num_copies_on_write >= 3  # forks of the shared partial block
    assert_engine_idle(engine)
