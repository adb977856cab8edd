"""Sliding-window attention in the paged cache, on a tiny Mistral whose every layer sees
the last 32 tokens: outputs longer than the window equal transformers', blocks behind the
window go back to the pool while the sequence keeps generating, and the prefix cache
still serves released (but cached) blocks correctly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.hf_reference import hf_greedy, load_hf_model, random_prompts

from kvrelay_worker.engine import LLM, SamplingParams

WINDOW = 32
BLOCK_SIZE = 16
NEW_TOKENS = 96  # three windows
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def window_folder(tiny_model: Callable[[str], Path]) -> Path:
    return tiny_model("mistral-window")


@pytest.fixture(scope="module")
def reference(window_folder: Path) -> tuple[list[list[int]], list[list[int]]]:
    prompts = random_prompts([20, 50, 130], seed=5)
    return prompts, hf_greedy(load_hf_model(window_folder), prompts, NEW_TOKENS)


@pytest.mark.slow
def test_blocks_behind_the_window_return_while_generating(
    window_folder: Path, reference: tuple[list[list[int]], list[list[int]]]
) -> None:
    prompts, _ = reference
    llm = LLM(str(window_folder), device="cpu", dtype="float32", num_kv_blocks=64,
              block_size=BLOCK_SIZE, max_num_batched_tokens=48)
    engine = llm.engine
    assert engine.kv.sliding_window == WINDOW
    engine.add_request("long", prompts[2], GREEDY)
    seq = engine.requests["long"].choices[0].seq
    held, free, released, lengths = [], [], [], []
    while engine.has_unfinished_requests():
        engine.step()
        if seq.is_finished:
            break
        held.append(engine.kv.num_blocks_held(seq))
        free.append(engine.kv.num_free_blocks)
        released.append(engine.kv.num_released_blocks)
        lengths.append(seq.num_tokens)
    # Without release the sequence would end holding ceil(226 / 16) = 15 blocks; with it,
    # never more than the window plus one chunk of 48 tokens, and 3 blocks once decoding.
    assert lengths[-1] == 130 + NEW_TOKENS - 1
    assert max(held) <= -(-(WINDOW + 48) // BLOCK_SIZE) + 1
    assert held[-1] <= WINDOW // BLOCK_SIZE + 1
    # While it decodes, blocks keep coming back (one per 16 tokens) and nearly the whole
    # pool stays free although the sequence is still running.
    decoding = [i for i, n in enumerate(lengths) if n > 130]
    assert released[decoding[-1]] - released[decoding[0]] >= NEW_TOKENS // BLOCK_SIZE - 1
    assert min(free[i] for i in decoding) >= 64 - (WINDOW // BLOCK_SIZE + 1)
    stats = engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "blocks leaked"


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"enable_prefix_caching": True},
    {"max_num_batched_tokens": 24},
    # 8 blocks hold 128 tokens, less than a 226-token sequence: enough with the window
    # released behind it, and small enough to preempt and recompute.
    {"num_kv_blocks": 8, "max_num_batched_tokens": 24},
], ids=["prefix-caching", "chunked-24", "preemption"])
def test_outputs_longer_than_the_window_match_transformers(
    window_folder: Path, reference: tuple[list[list[int]], list[list[int]]],
    options: dict[str, int | bool],
) -> None:
    prompts, expected = reference
    if "num_kv_blocks" in options:  # six sequences compete for the small pool
        prompts, expected = prompts * 2, expected * 2
    llm = LLM(str(window_folder), device="cpu", dtype="float32", block_size=BLOCK_SIZE,
              **options)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    # Again: the released blocks of the first run answer from the prefix cache.
    again = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in again] == expected
    if "num_kv_blocks" not in options:  # a small pool may have evicted them since
        assert again[2].num_cached_tokens >= 128
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "blocks leaked"
    if "num_kv_blocks" in options:
        assert stats["preemptions"] > 0
