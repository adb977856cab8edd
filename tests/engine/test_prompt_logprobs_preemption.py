"""A prompt being scored that is preempted half-way through its prefill (recompute or
swap) still reports every position once, equal to transformers' float32 log_softmax, and
leaves every block free. Tiny random model: pressure on a small pool is cheap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs
from helpers.hf_prompt_scores import assert_prompt_logprobs_match, hf_log_softmax
from helpers.hf_reference import load_hf_model, random_prompts

from kvrelay_worker.engine import LLM, SamplingParams, StepOutput

pytestmark = pytest.mark.usefixtures("one_thread")

POOL: dict[str, Any] = {"num_kv_blocks": 16, "block_size": 8, "max_model_len": 128,
                        "max_num_seqs": 8, "max_num_batched_tokens": 16}
SCORED = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
PRESSING = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_prompt_preempted_mid_prefill_is_scored_right(mode: str, folder: str) -> None:
    scored_prompt, *others = random_prompts([96, 16, 16, 16], seed=41)
    llm = LLM(folder, device="cpu", dtype="float32", preemption_mode=mode,
              num_swap_blocks=32 if mode == "swap" else None, **POOL)
    engine = llm.engine
    for i, prompt in enumerate(others):  # decoding while the scored prompt is prefilled
        engine.add_request(f"high{i}", prompt, PRESSING, priority=10)
    outputs: dict[str, list[StepOutput]] = {}
    for out in engine.step():
        outputs.setdefault(out.request_id, []).append(out)
    engine.add_request("scored", scored_prompt, SCORED, priority=0)
    seq = engine.requests["scored"].choices[0].seq
    preempted_in_prefill = 0
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        before, in_prefill = seq.num_preemptions, not seq.prompt_computed
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        preempted_in_prefill += in_prefill and seq.num_preemptions > before
    assert preempted_in_prefill, "never preempted while scoring: the test proves nothing"
    assert engine.stats()["swaps_out" if mode == "swap" else "recomputes"] > 0
    assert_engine_idle(engine)

    reported = [d.prompt_logprobs for s in outputs["scored"] for d in s.deltas
                if d.prompt_logprobs is not None]
    assert len(reported) == 1
    reference = hf_log_softmax(load_hf_model(Path(folder)), scored_prompt)
    assert_prompt_logprobs_match(reported[0], scored_prompt, reference, 2)
    assert final_outputs(outputs)["scored"].prompt_logprobs == reported[0]
