"""Speculative decoding through the engine, on the tiny random model: what it must keep.

The parity tests (test_hf_parity.py) check greedy tokens against transformers under
batching, chunked prefill, prefix caching and preemption; test_speculative_distribution.py
checks sampled distributions. Here: the sampler features that ride along (logprobs, seeds,
stop strings, min_tokens, n > 1, best_of), the requests that must decode without
speculation (opted out, penalties, beam search), failover resumes, and the stats.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers.engine_run import final_outputs, run_engine

from kvrelay_worker.engine import LLM, RequestOutput, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [100 + (i % 7) for i in range(40)]


def always(folder: str) -> dict[str, Any]:
    """Speculation on every step, the draft being the model itself (a second instance):
    greedy drafts always hold, sampled ones hold as often as the argmax is drawn."""
    return {"speculative": f"draft:{folder}", "speculative_adaptive": False}


def _llm(folder: str, **options: Any) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=128, max_num_seqs=8,
               **options)


def _generate(folder: str, params: SamplingParams, prompts: list[list[int]] | None = None,
              **options: Any) -> tuple[list[RequestOutput], dict[str, Any]]:
    llm = _llm(folder, **options)
    outs = llm.generate(prompts or [PROMPT], params)
    stats = llm.engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"], "blocks leaked"
    return outs, stats


def _same(a: list[RequestOutput], b: list[RequestOutput]) -> None:
    for x, y in zip(a, b, strict=True):
        assert [c.token_ids for c in x.choices] == [c.token_ids for c in y.choices]
        assert [c.text for c in x.choices] == [c.text for c in y.choices]
        assert [c.finish_reason for c in x.choices] == [c.finish_reason for c in y.choices]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=3),
    SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True,
                   logprobs=2),
    SamplingParams(max_tokens=40, temperature=1.0, top_k=20, seed=5, n=3, ignore_eos=True),
    SamplingParams(max_tokens=40, temperature=0.7, seed=8, min_tokens=30, stop_token_ids=[2]),
    SamplingParams(max_tokens=30, temperature=0.0, best_of=3, n=1, ignore_eos=True),
], ids=["greedy-logprobs", "seeded-top-p-logprobs", "seeded-n3", "min-tokens", "best-of"])
def test_outputs_equal_speculation_off(folder: str, params: SamplingParams) -> None:
    """Greedy and seeded requests give the same tokens, text, logprobs and finishes."""
    off, _ = _generate(folder, params)
    on, stats = _generate(folder, params, **always(folder))
    assert stats["spec_verify_steps"] > 0, "nothing was speculated"
    _same(off, on)
    for x, y in zip(off[0].choices, on[0].choices, strict=True):
        if x.logprobs is not None:
            assert y.logprobs is not None
            for a, b in zip(x.logprobs, y.logprobs, strict=True):
                assert a.token_id == b.token_id
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t for t, _ in a.top] == [t for t, _ in b.top]
        if x.cumulative_logprob is not None:
            assert y.cumulative_logprob == pytest.approx(x.cumulative_logprob, abs=1e-3)


def test_stop_strings_end_the_output_inside_accepted_drafts(folder: str) -> None:
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    (full,), _ = _generate(folder, greedy)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
    off, _ = _generate(folder, params)
    on, _ = _generate(folder, params, **always(folder))
    _same(off, on)
    assert on[0].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, speculative=False),
    SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, frequency_penalty=0.5),
    SamplingParams(max_tokens=12, beam_width=3, ignore_eos=True),
], ids=["opted-out", "repetition-penalty", "frequency-penalty", "beam-search"])
def test_requests_that_cannot_speculate_decode_without_it(folder: str,
                                                         params: SamplingParams) -> None:
    off, _ = _generate(folder, params)
    on, stats = _generate(folder, params, **always(folder))
    assert stats["spec_verify_steps"] == 0
    _same(off, on)


def test_a_resumed_request_continues_with_the_same_tokens(folder: str) -> None:
    """Failover: a seeded request taken over mid-answer by a speculating worker."""
    params = SamplingParams(max_tokens=40, temperature=0.9, seed=21, ignore_eos=True)
    (whole,), _ = _generate(folder, params, **always(folder))
    tokens = whole.choices[0].token_ids
    for cut in (1, 13, 27):
        engine = _llm(folder, **always(folder)).engine
        engine.add_request("r", PROMPT, params, prior_outputs=[tokens[:cut]])
        resumed = final_outputs(run_engine(engine))["r"]
        assert resumed.choices[0].token_ids == tokens


def test_stats_count_proposals_and_acceptances(folder: str) -> None:
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    _, stats = _generate(folder, params, **always(folder))
    assert 0 < stats["spec_accepted_tokens"] <= stats["spec_proposed_tokens"]
    assert stats["spec_acceptance_rate"] == pytest.approx(
        stats["spec_accepted_tokens"] / stats["spec_proposed_tokens"])
    assert stats["spec_mean_accepted_length"] == pytest.approx(
        (stats["spec_accepted_tokens"] + stats["spec_verify_steps"])
        / stats["spec_verify_steps"])
    # Fewer steps than tokens: accepted drafts came several per step.
    assert stats["steps"] < 40
    _, off = _generate(folder, params)
    assert "spec_verify_steps" not in off


def test_the_recent_outputs_index_serves_a_repeated_answer(folder: str) -> None:
    """A second, different prompt that leads into the first answer's text: its own
    history has no match at first, the worker's recent outputs do."""
    llm = _llm(folder, speculative="ngram", speculative_adaptive=False,
               speculative_ngram_min=2)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    first = llm.generate([PROMPT], params)[0].choices[0].token_ids
    before = llm.engine.stats()["spec_accepted_tokens"]
    # The same prompt again: its own tokens hold no match for the answer's n-grams, the
    # first answer does, and greedy decoding repeats it, so every draft holds.
    again = llm.generate([PROMPT], params)[0].choices[0].token_ids
    assert again == first
    assert llm.engine.speculator is not None
    assert llm.engine.speculator.recent.num_tokens == len(first)  # the first answer only
    assert llm.engine.stats()["spec_accepted_tokens"] - before >= len(first) // 2


def test_a_draft_model_with_another_vocabulary_is_refused(folder: str, tmp_path: Any,
                                                          tokenizer_folder: Any) -> None:
    from helpers.tiny_models import build_tiny_model

    from kvrelay_worker.engine import EngineConfigError

    other = build_tiny_model("llama-mqa", tmp_path / "small-vocab", tokenizer_folder,
                             vocab_size=64)
    with pytest.raises(EngineConfigError, match="vocabulary"):
        _llm(folder, speculative=f"draft:{other}")


def test_engine_direct_use_keeps_drafts_out_of_token_ids(folder: str) -> None:
    engine = _llm(folder, **always(folder)).engine
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=20, temperature=0.0,
                                                   ignore_eos=True))
    seen = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.scheduler.running:
            assert seq.num_computed_tokens == seq.num_tokens - 1
            seen += 1
    assert seen > 0


def test_a_quantized_self_draft_keeps_the_output(folder: str) -> None:
    """``draft:<the target>@int8``: the target's own weights, quantized, as the draft."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    off, _ = _generate(folder, params)
    on, stats = _generate(folder, params, speculative=f"draft:{folder}@int8",
                          speculative_adaptive=False)
    _same(off, on)
    assert stats["spec_accepted_tokens"] > 0
