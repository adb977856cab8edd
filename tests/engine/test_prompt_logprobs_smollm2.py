"""Prompt log-probabilities on SmolLM2 equal transformers' float32 ``log_softmax`` at
every prompt position, however the prompt is computed: over several chunks, beside other
requests, after the same prompt was cached; ``max_tokens`` 0 scores the prompt alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.engine_run import assert_engine_idle, one_torch_thread, run_engine
from helpers.hf_prompt_scores import assert_prompt_logprobs_match, hf_log_softmax
from helpers.hf_reference import hf_greedy, load_hf_model
from transformers import PreTrainedModel

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.errors import SamplingParamsError

pytestmark = pytest.mark.slow

# Non-ASCII on purpose: byte-level pieces of one character are prompt tokens too.
TEXT = ("Le café coûte 3 € ; une façade naïve — 東京は遠い. The quick brown fox jumps over "
        "the lazy dog, and then it jumps back again.")
OTHER = "Write one short sentence about the sea."
CHUNK = 16  # tokens per step: the prompt spans several steps


@pytest.fixture(scope="module")
def llm(smollm2_folder: Path) -> Iterator[LLM]:
    with one_torch_thread():
        yield LLM(str(smollm2_folder), device="cpu", dtype="float32",
                  max_num_batched_tokens=CHUNK, num_kv_blocks=96)


@pytest.fixture(scope="module")
def hf(smollm2_folder: Path) -> PreTrainedModel:
    return load_hf_model(smollm2_folder)


def ids_of(llm: LLM, text: str) -> list[int]:
    return list(llm.tokenizer.encode(text))


def test_scores_over_several_chunks_beside_other_requests(llm: LLM,
                                                          hf: PreTrainedModel) -> None:
    ids, other = ids_of(llm, TEXT), ids_of(llm, OTHER)
    assert len(ids) > 2 * CHUNK
    scored3 = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    scored0 = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tail = ids[len(ids) // 2:]
    a, b, c = llm.generate([ids, other, tail], [scored3, plain, scored0])

    assert_prompt_logprobs_match(a.prompt_logprobs or [], ids, hf_log_softmax(hf, ids), 3)
    assert_prompt_logprobs_match(c.prompt_logprobs or [], tail, hf_log_softmax(hf, tail), 0)
    assert b.prompt_logprobs is None  # not asked
    # Scoring changes no output: greedy tokens are transformers' own.
    assert [a.token_ids, b.token_ids, c.token_ids] == [
        hf_greedy(hf, [ids], 4)[0], hf_greedy(hf, [other], 8)[0], hf_greedy(hf, [tail], 2)[0]]
    assert_engine_idle(llm.engine)


def test_a_cached_prompt_is_computed_whole_and_fills_the_cache(llm: LLM,
                                                               hf: PreTrainedModel) -> None:
    ids = ids_of(llm, "A fresh prompt for the cache: " + TEXT)
    scored = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
    first = llm.generate([ids], scored)[0]
    assert first.num_cached_tokens == 0
    # Its blocks went to the prefix cache: a plain request takes them.
    plain = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert plain.num_cached_tokens == (len(ids) - 1) // 16 * 16 > 0
    # The prompt is cached now, yet a scored request computes all of it again.
    again = llm.generate([ids], scored)[0]
    assert again.num_cached_tokens == 0
    reference = hf_log_softmax(hf, ids)
    assert_prompt_logprobs_match(again.prompt_logprobs or [], ids, reference, 2)
    assert again.prompt_logprobs == first.prompt_logprobs
    assert again.token_ids == plain.token_ids == [int(reference[-1].argmax())]
    assert_engine_idle(llm.engine)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(llm: LLM,
                                                                 hf: PreTrainedModel) -> None:
    ids = ids_of(llm, TEXT)
    engine = llm.engine
    engine.add_request("echo", ids, SamplingParams(max_tokens=0, prompt_logprobs=1))
    engine.add_request("beside", ids_of(llm, OTHER),
                       SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    steps = run_engine(engine)["echo"]
    deltas = [d for s in steps for d in s.deltas]
    assert len(deltas) == 1  # one report: no token, its finish, the prompt's scores
    (delta,) = deltas
    assert (delta.index, delta.token_ids, delta.text, delta.finish_reason) == (0, [], "", "length")
    assert_prompt_logprobs_match(delta.prompt_logprobs or [], ids, hf_log_softmax(hf, ids), 1)
    output = steps[-1].output
    assert output is not None
    assert output.token_ids == []
    assert output.num_generated_tokens == 0
    assert output.prompt_logprobs == delta.prompt_logprobs
    assert_engine_idle(engine)  # every block free


def test_one_token_prompt_and_n_choices_report_once(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("one", [ids_of(llm, TEXT)[0]],
                       SamplingParams(max_tokens=0, prompt_logprobs=2))
    engine.add_request("n2", ids_of(llm, OTHER),
                       SamplingParams(n=2, max_tokens=3, temperature=0.8, seed=5,
                                      prompt_logprobs=1))
    outputs = run_engine(engine)
    one = [d for s in outputs["one"] for d in s.deltas]
    assert [(d.prompt_logprobs, d.finish_reason) for d in one] == [([None], "length")]
    carrying = [d for s in outputs["n2"] for d in s.deltas if d.prompt_logprobs is not None]
    assert [d.index for d in carrying] == [0]  # once, on choice 0's first delta
    assert carrying[0].token_ids  # with its first token
    assert_engine_idle(engine)


def test_a_resumed_choice_does_not_score_its_prompt_again(llm: LLM) -> None:
    """A job resumed after its first tokens went out already reported its prompt's
    scores: the new attempt computes none (and may use the prefix cache)."""
    engine = llm.engine
    ids = ids_of(llm, OTHER)
    engine.add_request("resumed", ids, SamplingParams(max_tokens=3, temperature=0.0,
                                                      prompt_logprobs=1),
                       prior_outputs=[[ids[-1]]], prior_texts=["x"])
    steps = run_engine(engine)["resumed"]
    assert all(d.prompt_logprobs is None for s in steps for d in s.deltas)
    assert steps[-1].output is not None
    assert steps[-1].output.prompt_logprobs is None
    assert_engine_idle(engine)


@pytest.mark.parametrize("options", [{"max_tokens": 0}, {"prompt_logprobs": 21},
                                     {"prompt_logprobs": -1}])
def test_bad_prompt_logprobs_options_are_refused(options: dict[str, int]) -> None:
    with pytest.raises(SamplingParamsError):
        SamplingParams(**options)  # type: ignore[arg-type]


def test_scores_are_float32_log_softmax_of_raw_logits(llm: LLM, hf: PreTrainedModel) -> None:
    """Temperature, penalties and bias shape sampling, not the prompt's scores."""
    ids = ids_of(llm, OTHER)
    shaped = SamplingParams(max_tokens=1, temperature=1.7, repetition_penalty=1.3,
                            logit_bias={int(ids[3]): 5.0}, seed=1, prompt_logprobs=2)
    out = llm.generate([ids], shaped)[0]
    reference = hf_log_softmax(hf, ids)
    assert_prompt_logprobs_match(out.prompt_logprobs or [], ids, reference, 2)
    assert reference.dtype == torch.float32
