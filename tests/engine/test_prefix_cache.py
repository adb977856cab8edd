"""The prefix cache through the engine: hits, equal outputs, salts, shared choices, stats."""

from __future__ import annotations

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, LLMEngine, RequestOutput, SamplingParams

PREFIX = random_prompts([256], seed=11)[0]
SUFFIXES = random_prompts([5, 23, 40], seed=12)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_llm(folder: str, caching: bool = True) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=96,
               enable_prefix_caching=caching)


def run_one(engine: LLMEngine, request_id: str, prompt: list[int], params: SamplingParams,
            cache_salt: str | None = None) -> RequestOutput:
    engine.add_request(request_id, prompt, params, cache_salt=cache_salt)
    out = final_outputs(run_engine(engine))[request_id]
    assert_engine_idle(engine)
    return out


def test_shared_prefix_is_served_from_the_cache_with_equal_outputs(folder: str) -> None:
    prompts = [PREFIX + s for s in SUFFIXES]
    cached = make_llm(folder)
    first = cached.generate([prompts[0]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    later = cached.generate(prompts[1:], GREEDY)
    assert [o.num_cached_tokens for o in later] == [256, 256]

    uncached = make_llm(folder, caching=False)
    reference = uncached.generate(prompts, GREEDY)
    assert all(o.num_cached_tokens == 0 for o in reference)
    assert uncached.engine.stats()["prefix_cache_hits"] == 0
    assert [o.token_ids for o in [first, *later]] == [o.token_ids for o in reference]


def test_a_repeated_prompt_recomputes_only_its_last_block(folder: str) -> None:
    llm = make_llm(folder)
    first = llm.generate([PREFIX], GREEDY)[0]
    again = llm.generate([PREFIX], GREEDY)[0]
    # 256 tokens are 16 full blocks, but the last token must run to give logits.
    assert again.num_cached_tokens == 240
    assert again.token_ids == first.token_ids


def test_stats_count_queries_and_hits(folder: str) -> None:
    llm = make_llm(folder)
    engine = llm.engine
    stats = engine.stats()
    assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (0, 0)
    a, b = PREFIX + SUFFIXES[0], PREFIX + SUFFIXES[1]
    llm.generate([a], GREEDY)
    stats = engine.stats()
    assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (len(a), 0)
    llm.generate([b], GREEDY)
    stats = engine.stats()
    assert (stats["prefix_cache_queries"], stats["prefix_cache_hits"]) == (len(a) + len(b), 256)
    assert stats["prefix_cache_hit_rate"] == pytest.approx(256 / (len(a) + len(b)))
    unrelated = random_prompts([100], seed=99)[0]
    llm.generate([unrelated], GREEDY)
    stats = engine.stats()
    assert stats["prefix_cache_queries"] == len(a) + len(b) + 100
    assert stats["prefix_cache_hits"] == 256


def test_cache_salt_separates_tenants(folder: str) -> None:
    engine = make_llm(folder).engine
    prompt = PREFIX + SUFFIXES[0]
    other = PREFIX + SUFFIXES[1]
    plain = run_one(engine, "plain", prompt, GREEDY)
    assert plain.num_cached_tokens == 0
    salted = run_one(engine, "salted", other, GREEDY, cache_salt="tenant-a")
    assert salted.num_cached_tokens == 0, "a salted request used unsalted blocks"
    same_tenant = run_one(engine, "same", prompt, GREEDY, cache_salt="tenant-a")
    assert same_tenant.num_cached_tokens == 256
    other_tenant = run_one(engine, "other", prompt, GREEDY, cache_salt="tenant-b")
    assert other_tenant.num_cached_tokens == 0
    unsalted = run_one(engine, "unsalted", other, GREEDY)
    assert unsalted.num_cached_tokens == 256
    # The salt changes where KV comes from, never the tokens.
    assert same_tenant.token_ids == other_tenant.token_ids == plain.token_ids
    assert unsalted.token_ids == salted.token_ids


def test_choices_share_the_prompt_blocks(folder: str) -> None:
    llm = make_llm(folder)
    engine = llm.engine
    prompt = PREFIX[:100]  # 6 full blocks and 4 tokens
    params = SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    engine.add_request("n3", prompt, params)
    shared_seen = False
    outputs = []
    for _ in range(50):
        outputs.extend(engine.step())
        if engine.scheduler.num_running == 3:
            tables = [s.block_table for s in engine.scheduler.running]
            assert tables[0][:6] == tables[1][:6] == tables[2][:6]
            for block_id in tables[0][:6]:
                assert engine.kv.pool.blocks[block_id].ref_cnt == 3
            assert len({t[6] for t in tables}) == 3, "the partial block is private"
            shared_seen = True
        if not engine.has_unfinished_requests():
            break
    assert shared_seen
    out = final_outputs({"n3": outputs})["n3"]
    assert len(out.choices) == 3
    assert all(len(c.token_ids) == 10 for c in out.choices)
    stats = engine.stats()
    # Choices 2 and 3 each found the 6 full blocks choice 1 computed.
    assert stats["prefix_cache_queries"] == 300
    assert stats["prefix_cache_hits"] == 2 * 96
    assert_engine_idle(engine)


def test_choices_match_single_requests_with_caching_off(folder: str) -> None:
    """Sharing blocks changes nothing: each choice equals the uncached run's choice."""
    prompt = PREFIX[:70]
    params = SamplingParams(n=3, max_tokens=8, temperature=0.9, seed=21, ignore_eos=True)
    shared = make_llm(folder).generate([prompt], params)[0]
    separate = make_llm(folder, caching=False).generate([prompt], params)[0]
    assert [c.token_ids for c in shared.choices] == [c.token_ids for c in separate.choices]
    assert len({tuple(c.token_ids) for c in shared.choices}) > 1
