"""Prompts that arrive together over a shared prefix compute it once: a waiting prompt
whose next blocks another prompt is prefilling waits for them to be cached."""

from __future__ import annotations

import pytest
from helpers.engine_run import run_engine
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams

PREFIX = random_prompts([256], seed=21)[0]  # 16 full blocks
SUFFIXES = random_prompts([7, 30, 45], seed=22)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("one_thread")


def make_llm(folder: str, caching: bool = True, budget: int = 2048) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=128,
               enable_prefix_caching=caching, max_num_batched_tokens=budget)


@pytest.mark.parametrize("budget", [2048, 96], ids=["one-step-prefill", "chunked"])
def test_a_burst_over_one_prefix_computes_it_once(folder: str, budget: int) -> None:
    prompts = [PREFIX + s for s in SUFFIXES]
    llm = make_llm(folder, budget=budget)
    outputs = llm.generate(prompts, GREEDY)  # all three waiting at the first step
    # The first computes the prefix; the others wait for it and start from the cache.
    assert [o.num_cached_tokens for o in outputs] == [0, 256, 256]
    stats = llm.engine.stats()
    assert stats["prefix_cache_hits"] == 512
    assert stats["prefill_waits"] >= 2
    # Same tokens as without any cache.
    reference = make_llm(folder, caching=False).generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]


def test_unrelated_prompts_and_other_salts_never_wait(folder: str) -> None:
    llm = make_llm(folder)
    engine = llm.engine
    engine.add_request("a", PREFIX + SUFFIXES[0], GREEDY)
    engine.add_request("b", PREFIX + SUFFIXES[1], GREEDY, cache_salt="tenant-b")
    engine.add_request("c", random_prompts([200], seed=23)[0], GREEDY)
    step = engine.step()
    # Every prompt was admitted in the first step: nothing they share is in flight.
    assert engine.scheduler.num_waiting == 0
    assert engine.stats()["prefill_waits"] == 0
    assert step is not None
    run_engine(engine)


def test_a_waiting_prompt_starts_once_the_shared_blocks_are_cached(folder: str) -> None:
    # 100 tokens a step: the first prompt (263 tokens) prefills in three steps, and its
    # third leaves room that the second would take, computing blocks 12-15 a second time.
    llm = make_llm(folder, budget=100)
    engine = llm.engine
    first, second = PREFIX + SUFFIXES[0], PREFIX + SUFFIXES[1]
    engine.add_request("first", first, GREEDY)
    engine.add_request("second", second, GREEDY)
    steps = 0
    while engine.scheduler.num_waiting:
        engine.step()
        steps += 1
    # Admitted in the step after the first prompt's last shared block was computed.
    assert steps == -(-len(first) // 100) + 1
    admitted = next(s for s in engine.scheduler.running if s.request_id == "second")
    assert admitted.num_cached_tokens == 256
    run_engine(engine)
