"""best_of: ``best_of`` candidates share the prompt's blocks; the ``n`` most likely return.

The candidates are made visible by a principled twin: a seeded row's noise depends only on
(seed, choice index, position) and the logits, so choice i of the same seeded request with
``n=best_of`` is candidate i. Its reported logprobs give every candidate's score.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine

from kvrelay_worker.engine import LLM, LLMEngine, SamplingParams
from kvrelay_worker.engine.errors import InvalidPromptError, SamplingParamsError
from kvrelay_worker.engine.outputs import CompletionChoice
from kvrelay_worker.engine.request_state import best_candidates

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57]
SAMPLED: dict[str, Any] = {"max_tokens": 6, "temperature": 1.0, "seed": 11, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm(folder: str) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=16)


def logprob_sum(choice: CompletionChoice) -> float:
    assert choice.logprobs is not None
    return math.fsum(entry.logprob for entry in choice.logprobs)


def candidates(llm: LLM, best_of: int) -> list[CompletionChoice]:
    """The candidates of a seeded best_of request: the choices of its n=best_of twin."""
    (twin,) = llm.generate([PROMPT], SamplingParams(n=best_of, logprobs=0, **SAMPLED))
    return twin.choices


def test_best_of_four_returns_the_candidate_with_the_highest_cumulative_logprob(
        llm: LLM) -> None:
    pool = candidates(llm, 4)
    scores = [logprob_sum(c) for c in pool]
    assert len({tuple(c.token_ids) for c in pool}) == 4, "the candidates should differ"
    (out,) = llm.generate([PROMPT], SamplingParams(n=1, best_of=4, logprobs=0, **SAMPLED))
    (best,) = out.choices
    assert best.index == 0
    assert best.cumulative_logprob == pytest.approx(logprob_sum(best), abs=1e-9)
    assert best.token_ids == pool[scores.index(max(scores))].token_ids
    assert best.cumulative_logprob == pytest.approx(max(scores), abs=1e-6)
    assert_engine_idle(llm.engine)


def test_the_score_is_kept_without_logprobs_asked(llm: LLM) -> None:
    pool = candidates(llm, 4)
    scores = [logprob_sum(c) for c in pool]
    (out,) = llm.generate([PROMPT], SamplingParams(n=1, best_of=4, **SAMPLED))
    assert out.logprobs is None
    assert out.choices[0].token_ids == pool[scores.index(max(scores))].token_ids
    assert out.choices[0].cumulative_logprob == pytest.approx(max(scores), abs=1e-6)


def test_best_of_four_n_two_returns_the_top_two_in_order(llm: LLM) -> None:
    pool = candidates(llm, 4)
    ranked = sorted(pool, key=logprob_sum, reverse=True)
    (out,) = llm.generate([PROMPT], SamplingParams(n=2, best_of=4, logprobs=0, **SAMPLED))
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.token_ids for c in out.choices] == [c.token_ids for c in ranked[:2]]
    first, second = (c.cumulative_logprob for c in out.choices)
    assert first is not None
    assert second is not None
    assert first >= second
    # Every candidate ran (and counts as generated); only the winners come back.
    assert out.num_generated_tokens == 4 * SAMPLED["max_tokens"]
    assert out.num_output_tokens == 2 * SAMPLED["max_tokens"]
    assert_engine_idle(llm.engine)


def test_candidates_share_the_prompt_blocks_and_report_nothing_until_done(folder: str) -> None:
    engine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64).engine
    engine.add_request("b", PROMPT, SamplingParams(n=2, best_of=3, **SAMPLED))
    choices = engine.requests["b"].choices
    assert len(choices) == 3
    assert all(c.seq.waits_for is choices[0].seq for c in choices[1:])
    steps = run_engine(engine)["b"]
    assert all(not s.deltas for s in steps[:-1])
    last = steps[-1]
    assert [d.index for d in last.deltas] == [0, 1]
    out = final_outputs({"b": steps})["b"]
    for delta, choice in zip(last.deltas, out.choices, strict=True):
        assert (delta.token_ids, delta.text, delta.finish_reason, delta.cumulative_logprob) == (
            choice.token_ids, choice.text, choice.finish_reason, choice.cumulative_logprob)
    assert engine.stats()["prefix_cache_hits"] > 0
    assert_engine_idle(engine)


def test_greedy_best_of_runs_n_sequences(llm: LLM) -> None:
    params = SamplingParams(n=1, best_of=4, temperature=0.0, max_tokens=4, ignore_eos=True)
    assert params.num_candidates == 1
    (out,) = llm.generate([PROMPT], params)
    (plain,) = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=4,
                                                     ignore_eos=True))
    assert out.token_ids == plain.token_ids


def test_an_aborted_best_of_request_reports_no_candidate(folder: str) -> None:
    engine: LLMEngine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64).engine
    engine.add_request("a", PROMPT, SamplingParams(n=1, best_of=3, **SAMPLED))
    engine.step()
    engine.step()
    assert engine.abort_request("a")
    (out,) = engine.step()
    assert out.finished
    assert out.deltas == []
    assert_engine_idle(engine)


def test_validation(llm: LLM) -> None:
    with pytest.raises(SamplingParamsError, match=r"best_of \(2\) must be at least n \(3\)"):
        SamplingParams(n=3, best_of=2)
    with pytest.raises(SamplingParamsError, match="best_of"):
        SamplingParams(best_of=129)
    with pytest.raises(InvalidPromptError, match="best_of"):
        llm.engine.add_request("r", PROMPT, SamplingParams(best_of=2, **SAMPLED),
                               prior_outputs=[[5, 6]])
    assert_engine_idle(llm.engine)


def test_ranking_breaks_ties_by_candidate_order_and_puts_unknown_last() -> None:
    assert best_candidates([-3.0, -1.0, -1.0, None, -2.0], 4) == [1, 2, 4, 0]
    assert best_candidates([None, -5.0], 2) == [1, 0]
