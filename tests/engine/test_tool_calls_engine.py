"""Tool calls and reasoning through the real engine: steps, outputs and resumes.

A tiny random model writes noise, so its output is steered: a named or required tool
choice by the tool grammar (the calls then validate whatever the model prefers), the
thinking model by a regex that spells a whole reasoning-then-answer output. The engine's
step deltas must assemble into the same calls, reasoning and answer as the finished
output, with finish reason "tool_calls"; and a request resumed after any number of its
tokens (what a taken-over job does, with what its events had sent) must send exactly the
rest: no piece twice, none missing, the same call ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine

from kvrelay.protocol import RegexFormat, ToolCallDelta, ToolSpec
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.outputs import RequestOutput, StepOutput
from kvrelay_worker.engine.tools.parsed_output import tool_call_id
from kvrelay_worker.engine.tools.plan import ToolPlan

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
             "minItems": 3, "maxItems": 3},
    "unit": {"enum": ["C", "F"]}}, "required": ["city", "days", "unit"],
    "additionalProperties": False}
TOOLS = tuple(msgspec.convert([
    {"type": "function", "function": {"name": "forecast", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "clock", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
        "required": ["tz"], "additionalProperties": False}}},
], list[ToolSpec]))
NAMED = ToolPlan(mode="named", tools=TOOLS, named="forecast")
REQUIRED = ToolPlan(mode="required", tools=TOOLS)
THOUGHT = "<think>\nThe user wants a greeting.\n\nBe brief.\n</think>\n\nHello there!"


@dataclass
class Sent:
    """What a choice's events carried, step by step (as the worker publishes them)."""

    tokens: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[list[ToolCallDelta]] = field(default_factory=list)
    finish_reason: str | None = None

    def through(self, steps: int) -> tuple[list[int], str, str, list[ToolCallDelta]]:
        return ([t for ts in self.tokens[:steps] for t in ts], "".join(self.texts[:steps]),
                "".join(self.reasoning[:steps]), [c for cs in self.calls[:steps] for c in cs])


def sent_per_choice(steps: list[StepOutput]) -> dict[int, Sent]:
    sent: dict[int, Sent] = {}
    for out in steps:
        for delta in out.deltas:
            s = sent.setdefault(delta.index, Sent())
            s.tokens.append(list(delta.token_ids))
            s.texts.append(delta.text)
            s.reasoning.append(delta.reasoning)
            s.calls.append(list(delta.tool_calls))
            if delta.finish_reason is not None:
                s.finish_reason = delta.finish_reason
    return sent


def assembled(deltas: list[ToolCallDelta]) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        entry = calls.setdefault(d.index, ["", "", ""])
        if d.id is not None:
            assert not entry[0], "a call's id and name are sent once"
            entry[0], entry[1] = d.id, d.name or ""
        entry[2] += d.arguments
    return [(c[0], c[1], c[2]) for _, c in sorted(calls.items())]


@pytest.fixture(scope="module")
def llm(folder: str) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=512)


@pytest.fixture(scope="module")
def thinker(tiny_model: Callable[[str], Path]) -> LLM:
    return LLM(str(tiny_model("qwen3-qk-norm")), device="cpu", dtype="float32",
               num_kv_blocks=256)


def run(llm: LLM, request_id: str, params: SamplingParams,
        **prior: Any) -> tuple[dict[int, Sent], RequestOutput]:
    llm.engine.add_request(request_id, "Forecast for Bergen, please:", params, **prior)
    steps = run_engine(llm.engine)[request_id]
    return sent_per_choice(steps), final_outputs({request_id: steps})[request_id]


def test_a_named_call_streams_as_its_output_says(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=120, tool_plan=NAMED)
    sent, output = run(llm, "named-1", params)
    (choice,) = output.choices
    streamed = assembled([c for cs in sent[0].calls for c in cs])
    assert streamed == [(tool_call_id("named-1", 0, 0), "forecast",
                         choice.tool_calls[0].function.arguments)]
    jsonschema.validate(json.loads(streamed[0][2]), SCHEMA)
    assert [c.id for c in choice.tool_calls] == [tool_call_id("named-1", 0, 0)]
    assert choice.text == ""
    assert "".join(sent[0].texts) == ""
    assert choice.finish_reason == sent[0].finish_reason == "tool_calls"
    assert sum(1 for cs in sent[0].calls if any(c.arguments for c in cs)) > 3, \
        "the arguments should stream in pieces"
    assert_engine_idle(llm.engine)


def test_required_calls_validate_for_every_choice(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=200, tool_plan=REQUIRED)
    sent, output = run(llm, "required-1", params)
    schemas = {t.function.name: t.function.parameters for t in TOOLS}
    for choice in output.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.tool_calls, choice.text
        for i, call in enumerate(choice.tool_calls):
            assert call.id == tool_call_id("required-1", choice.index, i)
            jsonschema.validate(json.loads(call.function.arguments),
                                schemas[call.function.name])
        streamed = assembled([c for cs in sent[choice.index].calls for c in cs])
        assert streamed == [(c.id, c.function.name, c.function.arguments)
                            for c in choice.tool_calls]


@pytest.mark.parametrize("plan", [NAMED, REQUIRED], ids=["named", "required"])
def test_a_resume_after_any_step_sends_exactly_the_rest(llm: LLM, plan: ToolPlan) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=120, tool_plan=plan)
    whole, output = run(llm, "resume-1", params)
    expected = assembled([c for cs in whole[0].calls for c in cs])
    num_steps = len(whole[0].tokens)
    for steps in range(1, num_steps, max(1, num_steps // 8)):
        tokens, text, reasoning, calls = whole[0].through(steps)
        rest, again = run(llm, "resume-1", params, prior_outputs=[tokens],
                          prior_texts=[text], prior_reasoning=[reasoning],
                          prior_tool_calls=[calls])
        after = [c for cs in rest[0].calls for c in cs]
        assert assembled(calls + after) == expected, steps
        assert text + "".join(rest[0].texts) == ""
        assert rest[0].finish_reason == "tool_calls"
        assert again.choices[0].tool_calls == output.choices[0].tool_calls
    assert_engine_idle(llm.engine)


def test_reasoning_and_answer_split_in_steps_output_and_resume(thinker: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=80, reasoning_parser="think",
                            response_format=RegexFormat(pattern=THOUGHT.replace(".", r"\.")))
    whole, output = run(thinker, "think-1", params)
    (choice,) = output.choices
    assert (choice.reasoning, choice.text) == (
        "The user wants a greeting.\n\nBe brief.", "Hello there!")
    assert "".join(whole[0].reasoning) == choice.reasoning
    assert "".join(whole[0].texts) == choice.text
    assert choice.finish_reason == "stop"
    num_steps = len(whole[0].tokens)
    for steps in range(1, num_steps, 3):
        tokens, text, reasoning, calls = whole[0].through(steps)
        rest, _ = run(thinker, "think-1", params, prior_outputs=[tokens], prior_texts=[text],
                      prior_reasoning=[reasoning], prior_tool_calls=[calls])
        assert reasoning + "".join(rest[0].reasoning) == choice.reasoning, steps
        assert text + "".join(rest[0].texts) == choice.text, steps
    assert_engine_idle(thinker.engine)


def test_a_choice_that_ended_in_calls_stays_ended_on_resume(llm: LLM) -> None:
    """Choice 0 had finished with "tool_calls" before the takeover, choice 1 had not."""
    params = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=200, tool_plan=REQUIRED)
    whole, output = run(llm, "ended-1", params)
    ended = whole[0].through(len(whole[0].tokens))
    partial = whole[1].through(3)
    rest, again = run(llm, "ended-1", params, prior_outputs=[ended[0], partial[0]],
                      prior_texts=[ended[1], partial[1]], prior_finish_reasons=["tool_calls", None],
                      prior_reasoning=[ended[2], partial[2]],
                      prior_tool_calls=[ended[3], partial[3]])
    assert 0 not in rest, "an ended choice is not reported again"
    assert [c.finish_reason for c in again.choices] == ["tool_calls", "tool_calls"]
    assert again.choices[0].tool_calls == output.choices[0].tool_calls
    after = [c for cs in rest[1].calls for c in cs]
    assert assembled(partial[3] + after) == [
        (c.id, c.function.name, c.function.arguments) for c in output.choices[1].tool_calls]
    assert_engine_idle(llm.engine)
