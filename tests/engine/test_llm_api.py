"""The offline API: ``LLM(model, device=..., dtype=..., **engine_options).generate(...)``.

Output shape and order, parameter broadcasting, the tokenizer, engine stats, priorities
and aborts, on a tiny random model with SmolLM2's tokenizer.
"""

from __future__ import annotations

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts

from kvrelay.protocol import DEFAULT_MAX_TOKENS
from kvrelay_worker.engine import LLM, LLMEngine, RequestOutput, SamplingParams

EOS = 2
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llm(folder: str) -> LLM:
    """Shared by the tests that leave the engine idle (they check that they do)."""
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=16)


# ------------------------------------------------------------------ generate


def test_engine_options_reach_the_engine(folder: str) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=40, max_num_seqs=3,
              max_num_batched_tokens=100, max_model_len=256, block_size=32, seed=4)
    config = llm.engine.config
    assert (config.num_kv_blocks, config.max_num_seqs, config.max_num_batched_tokens,
            config.block_size, config.seed) == (40, 3, 100, 32, 4)
    stats = llm.engine.stats()
    assert stats["total_blocks"] == 40
    assert stats["block_size"] == 32
    assert stats["max_model_len"] == 256


def test_prompts_of_every_form_come_back_in_order(llm: LLM) -> None:
    tokenizer = llm.tokenizer
    ids_prompt = random_prompts([20], seed=1)[0]
    prompts: list[str | list[int]] = ["The quick brown fox", ids_prompt, "Hi"]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (8, 2, 5)]
    outputs = llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outputs] == [
        tokenizer.encode("The quick brown fox"), ids_prompt, tokenizer.encode("Hi")]
    assert [o.prompt for o in outputs] == ["The quick brown fox", None, "Hi"]
    assert [len(o.token_ids) for o in outputs] == [8, 2, 5]
    for out in outputs:
        assert isinstance(out, RequestOutput)
        assert out.finish_reason == "length"
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert out.num_cached_tokens == 0
        assert out.logprobs is None
        assert len(out.choices) == 1
    assert_engine_idle(llm.engine)


def test_a_single_prompt_and_a_single_id_list(llm: LLM) -> None:
    (text_out,) = llm.generate("Hello there", GREEDY)
    assert text_out.prompt == "Hello there"
    (ids_out,) = llm.generate([5, 6, 7, 8], GREEDY)
    assert ids_out.prompt_token_ids == [5, 6, 7, 8]
    assert llm.generate([], GREEDY) == []


def test_one_params_applies_to_all_and_a_list_must_match(llm: LLM) -> None:
    prompts = random_prompts([4, 9, 13], seed=2)
    outputs = llm.generate(prompts, GREEDY)
    assert [len(o.token_ids) for o in outputs] == [6, 6, 6]
    # The same prompts one by one give the same tokens (batching changes nothing).
    for prompt, out in zip(prompts, outputs, strict=True):
        assert llm.generate([prompt], GREEDY)[0].token_ids == out.token_ids
    with pytest.raises(ValueError, match="got 2 SamplingParams for 3 prompts"):
        llm.generate(prompts, [GREEDY, GREEDY])
    with pytest.raises(ValueError, match="3 prompts"):
        llm.generate(prompts, GREEDY, priority=[1, 2])
    assert_engine_idle(llm.engine)


def test_default_params(llm: LLM) -> None:
    (out,) = llm.generate([[10, 20, 30]])
    assert len(out.token_ids) <= DEFAULT_MAX_TOKENS  # the one default: SDK, wire, engine, CLI
    assert out.finish_reason in ("stop", "length")


def test_finish_reasons(llm: LLM) -> None:
    stop_now = SamplingParams(max_tokens=10, temperature=0.0, logit_bias={EOS: 100.0})
    (eos,) = llm.generate([[10, 11, 12]], stop_now)
    assert eos.finish_reason == "stop"
    assert eos.token_ids == [EOS]
    assert eos.text == ""

    (free,) = llm.generate([[10, 11, 12]], SamplingParams(max_tokens=8, temperature=0.0,
                                                          ignore_eos=True))
    assert free.finish_reason == "length"
    stop_id = free.token_ids[3]
    first = free.token_ids.index(stop_id)
    (stopped,) = llm.generate([[10, 11, 12]], SamplingParams(
        max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_id]))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert_engine_idle(llm.engine)


def test_logprobs_shape(llm: LLM) -> None:
    prompts = random_prompts([7, 12], seed=3)
    params = [SamplingParams(max_tokens=5, temperature=0.0, logprobs=1, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.0, logprobs=5, ignore_eos=True)]
    outputs = llm.generate(prompts, params)
    for out, k in zip(outputs, (1, 5), strict=True):
        assert out.logprobs is not None
        assert len(out.logprobs) == len(out.token_ids) == 5
        for token, entry in zip(out.token_ids, out.logprobs, strict=True):
            assert entry.token_id == token
            assert len(entry.top) == k
            assert entry.top[0][0] == token  # greedy: the sampled token is the top one
            assert entry.logprob == pytest.approx(entry.top[0][1])
            assert entry.logprob <= 0.0
            values = [v for _, v in entry.top]
            assert values == sorted(values, reverse=True)
    (zero,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, logprobs=0))
    assert zero.logprobs is not None
    assert all(e.top == [] and e.logprob <= 0.0 for e in zero.logprobs)


def test_n_choices_with_the_first_mirrored(llm: LLM) -> None:
    params = SamplingParams(n=3, max_tokens=5, temperature=1.0, seed=8, ignore_eos=True,
                            logprobs=2)
    (out,) = llm.generate([[40, 41, 42, 43]], params)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for c in out.choices)
    first = out.choices[0]
    assert (out.text, out.token_ids, out.finish_reason, out.logprobs) == (
        first.text, first.token_ids, first.finish_reason, first.logprobs)
    assert out.num_output_tokens == 15
    assert_engine_idle(llm.engine)


def test_use_tqdm(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = llm.generate([[1, 2], [3, 4]], GREEDY, use_tqdm=True)
    assert len(outputs) == 2
    err = capsys.readouterr().err
    assert "generate" in err
    assert "2/2" in err


def test_tokenizer_has_a_chat_template(llm: LLM) -> None:
    tokenizer = llm.tokenizer
    assert tokenizer.chat_template
    (out,) = llm.chat([{"role": "user", "content": "Hello!"}], GREEDY)
    expected_tail = tokenizer.encode("<|im_start|>assistant\n")
    assert out.prompt_token_ids[-len(expected_tail):] == expected_tail
    outs = llm.chat([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                    GREEDY)
    assert len(outs) == 2


def test_stats(llm: LLM) -> None:
    stats = llm.engine.stats()
    for key in ("running", "waiting", "free_blocks", "total_blocks", "prefix_cache_hits",
                "prefix_cache_queries", "preemptions", "max_batch_size"):
        assert isinstance(stats[key], int), key
    assert stats["total_blocks"] == 64
    llm.generate(random_prompts([3, 4, 5, 6, 7], seed=4), GREEDY)
    stats = llm.engine.stats()
    assert stats["max_batch_size"] >= 5
    assert stats["preemptions"] == 0
    assert_engine_idle(llm.engine)


# ------------------------------------------------------------------ priorities


def test_a_later_higher_priority_request_runs_before_earlier_ones(folder: str) -> None:
    engine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=1,
                 max_model_len=128).engine
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = random_prompts([10, 11, 12, 13], seed=5)
    for name, prompt in zip("abc", prompts, strict=False):
        engine.add_request(name, prompt, params)
    engine.step()  # "a" is running now
    engine.add_request("urgent", prompts[3], params, priority=5)
    order: list[str] = []
    for _ in range(100):
        order += [out.request_id for out in engine.step() if out.finished]
        if not engine.has_unfinished_requests():
            break
    assert order == ["a", "urgent", "b", "c"]
    assert_engine_idle(engine)


def test_generate_priorities(folder: str) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=1,
              max_model_len=128)
    prompts = random_prompts([10, 11, 12], seed=6)
    outputs = llm.generate(prompts, GREEDY, priority=[0, 0, 3])
    assert [o.prompt_token_ids for o in outputs] == prompts  # still in prompt order
    # With one sequence at a time, the priority-3 request ran first, alone: its output
    # equals a run on a fresh engine.
    fresh = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=1,
                max_model_len=128)
    assert fresh.generate([prompts[2]], GREEDY)[0].token_ids == outputs[2].token_ids


def test_preemption_spares_the_higher_priority_request(folder: str) -> None:
    # 8 blocks of 16 tokens; two sequences growing to 90 tokens each cannot both fit.
    engine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=2,
                 max_model_len=128).engine
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    low_prompt, high_prompt = random_prompts([40, 40], seed=7)
    engine.add_request("low", low_prompt, params, priority=0)
    engine.add_request("high", high_prompt, params, priority=1)
    low = engine.requests["low"].choices[0].seq
    high = engine.requests["high"].choices[0].seq
    finals = final_outputs(run_engine(engine))
    assert engine.stats()["preemptions"] > 0
    assert low.num_preemptions > 0
    assert high.num_preemptions == 0
    assert_engine_idle(engine)
    # Preemption and recompute change no token.
    fresh = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64)
    assert fresh.generate([low_prompt], params)[0].token_ids == finals["low"].token_ids


# ------------------------------------------------------------------ aborts


def test_abort_frees_blocks_and_reports_abort(llm: LLM) -> None:
    engine: LLMEngine = llm.engine
    params = SamplingParams(n=2, max_tokens=50, temperature=1.0, ignore_eos=True)
    engine.add_request("doomed", random_prompts([40], seed=8)[0], params)
    engine.add_request("kept", [1, 2, 3], GREEDY)
    news: dict[str, list[object]] = {}
    for _ in range(3):
        for out in engine.step():
            news.setdefault(out.request_id, []).append(out)
    assert engine.stats()["free_blocks"] < engine.stats()["total_blocks"]
    held = engine.kv.num_blocks - engine.kv.num_free_blocks
    assert engine.abort_request("doomed") is True
    assert engine.abort_request("doomed") is False
    assert engine.abort_request("never-seen") is False
    assert engine.kv.num_blocks - engine.kv.num_free_blocks < held
    assert "doomed" not in engine.requests
    outputs = run_engine(engine)
    (aborted,) = outputs["doomed"]
    assert aborted.finished
    assert aborted.output is not None
    assert [c.finish_reason for c in aborted.output.choices] == ["abort", "abort"]
    assert all(d.finish_reason == "abort" for d in aborted.deltas)
    assert final_outputs(outputs)["kept"].finish_reason == "length"
    assert_engine_idle(engine)


def test_abort_a_waiting_request(folder: str) -> None:
    engine = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=8, max_num_seqs=1,
                 max_model_len=128).engine
    engine.add_request("first", [1, 2, 3], GREEDY)
    engine.add_request("queued", [4, 5, 6], GREEDY)
    engine.step()
    assert engine.stats()["waiting"] == 1
    assert engine.abort_request("queued")
    assert engine.stats()["waiting"] == 0
    outputs = final_outputs(run_engine(engine))
    assert outputs["queued"].finish_reason == "abort"
    assert outputs["queued"].token_ids == []
    assert outputs["first"].finish_reason == "length"
    assert_engine_idle(engine)
