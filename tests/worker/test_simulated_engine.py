"""The simulated engine: GPU-paced steps with deterministic tokens, and the limits it keeps.

The clock is frozen and sleeps are recorded, so each step's requested duration must equal
the step-time model of the tokens it batched: the pacing is checked without timing.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvrelay_worker.engine.errors import InvalidPromptError
from kvrelay_worker.engine.outputs import StepOutput
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.intake.job_request import prompt_ids_for
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel
from kvrelay_worker.simulated.tokenizer import SimulatedTokenizer

MODEL = StepTimeModel(step_ms=20.0, token_ms=0.5)


def make_engine(sleeps: list[float], **options: int) -> SimulatedEngine:
    return SimulatedEngine(MODEL, sleep=sleeps.append, clock=lambda: 100.0, **options)


def run(engine: SimulatedEngine) -> tuple[dict[str, list[StepOutput]], list[int]]:
    """Step until idle: every request's outputs, and the tokens each step batched."""
    outputs: dict[str, list[StepOutput]] = {}
    batched: list[int] = []
    while engine.has_unfinished_requests():
        before = engine.batched_tokens
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        batched.append(engine.batched_tokens - before)
    return outputs, batched


def tokens_of(outs: list[StepOutput], index: int = 0) -> list[int]:
    return [t for o in outs for d in o.deltas if d.index == index for t in d.token_ids]


def test_each_step_sleeps_what_the_model_gives_for_its_batched_tokens() -> None:
    sleeps: list[float] = []
    engine = make_engine(sleeps)
    prompts = {"a": [1] * 10, "b": [2] * 7, "c": [3] * 30}
    limits = {"a": 5, "b": 8, "c": 3}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=limits[rid]))
    outputs, batched = run(engine)

    for rid, limit in limits.items():
        assert len(tokens_of(outputs[rid])) == limit
        final = outputs[rid][-1]
        assert final.finished
        assert final.output is not None
        assert final.output.finish_reason == "length"
        assert final.output.num_generated_tokens == limit
    # One prefill step that also samples each first token, then one token per step.
    assert engine.num_steps == max(limits.values()) == len(sleeps)
    assert batched[0] == sum(len(p) for p in prompts.values())
    assert engine.batched_tokens == sum(len(p) for p in prompts.values()) + sum(
        n - 1 for n in limits.values())
    assert sleeps == pytest.approx([MODEL.seconds(n) for n in batched if n])
    assert engine.stats()["simulated_modeled_s"] == pytest.approx(sum(sleeps))
    assert engine.stats()["requests"] == 0
    # The step-time percentiles a benchmark sets the streams' token gaps against.
    ordered = sorted(sleeps)
    assert engine.stats()["simulated_step_ms_p50"] == pytest.approx(
        ordered[len(ordered) // 2] * 1000)
    assert engine.stats()["simulated_step_ms_p99"] == pytest.approx(ordered[-1] * 1000)


def test_tokens_depend_only_on_prompt_choice_and_position() -> None:
    engine = make_engine([])
    params = SamplingParams(n=2, max_tokens=12)
    engine.add_request("x", [5, 6, 7], params)
    engine.add_request("y", [5, 6, 7], params)
    outputs, _ = run(engine)
    first, second = tokens_of(outputs["x"], 0), tokens_of(outputs["x"], 1)
    assert first == tokens_of(outputs["y"], 0)
    assert second == tokens_of(outputs["y"], 1)
    assert first != second
    assert len(first) == len(second) == 12

    # A resumed request continues exactly after what an earlier attempt reported.
    tokenizer = SimulatedTokenizer()
    resumed = make_engine([])
    resumed.add_request("x", [5, 6, 7], params, prior_outputs=[first[:5], second[:9]],
                        prior_texts=[tokenizer.decode(first[:5]), tokenizer.decode(second[:9])])
    outputs, _ = run(resumed)
    assert tokens_of(outputs["x"], 0) == first[5:]
    assert tokens_of(outputs["x"], 1) == second[9:]
    final = outputs["x"][-1].output
    assert final is not None
    assert final.choices[1].text == tokenizer.decode(second)


def test_stop_strings_and_stop_tokens_end_a_choice() -> None:
    engine = make_engine([])
    engine.add_request("free", [9, 9], SamplingParams(max_tokens=10))
    free, _ = run(engine)
    ids = tokens_of(free["free"])
    text = SimulatedTokenizer.token_text

    engine.add_request("by-text", [9, 9], SamplingParams(max_tokens=10, stop=[text(ids[3])]))
    engine.add_request("by-id", [9, 9], SamplingParams(max_tokens=10, stop_token_ids=[ids[5]]))
    engine.add_request("too-early", [9, 9], SamplingParams(
        max_tokens=10, stop_token_ids=[ids[1]], min_tokens=4))
    outputs, _ = run(engine)
    by_text = outputs["by-text"][-1].output
    assert by_text is not None
    assert by_text.finish_reason == "stop"
    assert by_text.text == "".join(text(t) for t in ids[:3])
    assert "".join(d.text for o in outputs["by-text"] for d in o.deltas) == by_text.text
    by_id = outputs["by-id"][-1].output
    assert by_id is not None
    assert (by_id.finish_reason, by_id.token_ids) == ("stop", ids[:6])
    too_early = outputs["too-early"][-1].output
    assert too_early is not None
    assert too_early.finish_reason == "length"


def test_batch_size_and_token_budget_are_kept() -> None:
    engine = make_engine([], max_num_seqs=2, max_num_batched_tokens=32)
    for i in range(3):
        engine.add_request(f"r{i}", [i + 1] * 4, SamplingParams(max_tokens=4))
    engine.add_request("long", [7] * 100, SamplingParams(max_tokens=1))
    outputs, batched = run(engine)
    assert engine.max_batch_size == 2
    assert max(batched) <= 32
    assert all(len(tokens_of(outputs[f"r{i}"])) == 4 for i in range(3))
    assert len(tokens_of(outputs["long"])) == 1
    # 100 prompt tokens at no more than 32 a step: its token comes 4 steps after it starts.
    assert sum(b for b in batched) == 3 * 4 + 3 * 3 + 100


def test_requests_that_need_logits_are_refused_and_aborts_are_reported() -> None:
    engine = make_engine([])
    for params in (SamplingParams(logprobs=2), SamplingParams(beam_width=2),
                   SamplingParams(n=1, best_of=3, temperature=1.0),
                   SamplingParams(max_tokens=0, prompt_logprobs=1)):
        with pytest.raises(InvalidPromptError, match="simulated engine"):
            engine.add_request("bad", [1, 2], params)
    assert not engine.has_unfinished_requests()

    engine.add_request("gone", [1, 2], SamplingParams(max_tokens=50))
    engine.step()
    assert engine.abort_request("gone")
    (out,) = engine.step()
    assert out.finished
    assert [d.finish_reason for d in out.deltas] == ["abort"]
    assert not engine.has_unfinished_requests()


def test_text_and_chat_prompts_tokenize_without_a_model() -> None:
    from kvrelay.protocol import ChatMessage, GenerateRequest

    engine = make_engine([])
    plain = GenerateRequest(job_id="j", model="simulated", prompt="hello there, world")
    chat = GenerateRequest(job_id="j", model="simulated",
                           messages=[ChatMessage(role="user", content="hello there, world")])
    plain_ids = prompt_ids_for(plain, engine.tokenizer, engine.vocab_size, engine.max_model_len)
    chat_ids = prompt_ids_for(chat, engine.tokenizer, engine.vocab_size, engine.max_model_len)
    assert len(plain_ids) == 5  # 18 bytes, 4 to a token
    assert len(chat_ids) > len(plain_ids)


def test_a_simulated_worker_imports_no_torch() -> None:
    """What lets dozens of simulated workers share one small machine."""
    code = ("import sys; import kvrelay_worker.app; from kvrelay_worker.runtime import "
            "simulated_engine; from kvrelay_worker.settings import WorkerSettings; "
            "simulated_engine(WorkerSettings(model='simulated')); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'numpy', 'triton')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"KVRELAY_MODEL": "simulated", "PATH": ""}, timeout=60,
                            check=True)
    assert result.stdout.strip() == "[]"
