"""The output parsers on text alone: however the text is cut, the same result.

A parser's result must depend only on the text it was given, never on where the
detokenizer's deltas fell: that is what lets a resumed attempt replay the earlier tokens
and continue exactly. So every output here is parsed whole and cut at random, and must
give the same answer text, reasoning and calls; and for every cut, a fresh parser
resumed after what the first had sent must send exactly the rest.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvrelay.protocol import FunctionSpec, ToolCallDelta, ToolSpec
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.tools.output_parsing import (
    OutputParsing,
    ParsedDelta,
    output_parsing_for,
)
from kvrelay_worker.engine.tools.parsed_output import tool_call_id
from kvrelay_worker.engine.tools.plan import ToolPlan

TOOLS = tuple(ToolSpec(function=FunctionSpec(name=n)) for n in ("get_weather", "get_time"))
HERMES = ToolPlan(mode="auto", tools=TOOLS, format="hermes")
LLAMA = ToolPlan(mode="auto", tools=TOOLS, format="llama3_json")
MISTRAL = ToolPlan(mode="auto", tools=TOOLS, format="mistral")
NAMED = ToolPlan(mode="named", tools=TOOLS, named="get_weather")
REQUIRED = ToolPlan(mode="required", tools=TOOLS)
W = '{"city": "Paris \\"centre\\"", "days": [1, 2.5e3, null], "x": {"y": true}}'
T = '{"tz": "CET"}'

# (plan, reasoning parser, output, expected text, expected reasoning, expected calls)
Case = tuple[ToolPlan | None, str | None, str, str, str, list[tuple[str, str]]]
CASES: list[Case] = [
    (HERMES, None, f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
     "", "", [("get_weather", W)]),
    (HERMES, None, f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}'
     f'\n</tool_call>\n<tool_call>\n{{"arguments": {T}, "name": "get_time"}}\n</tool_call>\n',
     "Let me check.", "", [("get_weather", W), ("get_time", T)]),
    (HERMES, None, "<tool_call>not json</tool_call> and text", "<tool_call>not json</tool_call> "
     "and text", "", []),
    (HERMES, None, 'Hi <tool_call>{"name": "get_weather", "argu', 'Hi <tool_call>{"name": '
     '"get_weather", "argu', "", []),
    (HERMES, None, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "", []),
    (HERMES, None, "a < b and <tool_c are fine", "a < b and <tool_c are fine", "", []),
    (LLAMA, None, f'{{"name": "get_weather", "parameters": {W}}}; {{"name": "get_time", '
     f'"parameters": {T}}}', "", "", [("get_weather", W), ("get_time", T)]),
    (LLAMA, None, f'<|python_tag|>{{"name": "get_time", "arguments": {T}}}', "", "",
     [("get_time", T)]),
    (LLAMA, None, f'Sure: {{"name": "get_time", "parameters": {T}}}', "Sure:", "",
     [("get_time", T)]),
    (LLAMA, None, '{"answer": 42, "name": "Bob"}', '{"answer": 42, "name": "Bob"}', "", []),
    (LLAMA, None, "The weather is fine.", "The weather is fine.", "", []),
    (MISTRAL, None, f'Ok [TOOL_CALLS] [{{"name": "get_weather", "arguments": {W}, "id": '
     f'"abcdefghi"}}, {{"name": "get_time", "arguments": {T}}}]', "Ok", "",
     [("get_weather", W), ("get_time", T)]),
    (MISTRAL, None, f"[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e"
     f"[ARGS]{T}", "", "", [("get_weather", W), ("get_time", T)]),
    (MISTRAL, None, "[TOOL_CALLS] no list here", "[TOOL_CALLS] no list here", "", []),
    (NAMED, None, f"  {W}\n", "", "", [("get_weather", W)]),
    (REQUIRED, None, f'[{{"name": "get_weather", "arguments": {W}}}, {{"name": "get_time", '
     f'"arguments": {T}}}]', "", "", [("get_weather", W), ("get_time", T)]),
    (REQUIRED, None, "I refuse", "I refuse", "", []),
    (None, "think", "<think>\nStep one.\n\nStep two.\n</think>\n\nThe answer is 4.",
     "The answer is 4.", "Step one.\n\nStep two.", []),
    (None, "think", "No thinking today.", "No thinking today.", "", []),
    (None, "think", "<think>cut short", "", "cut short", []),
    (HERMES, "think", f'<think>\nA call.\n</think>\n\n<tool_call>\n{{"name": "get_time", '
     f'"arguments": {T}}}\n</tool_call>', "", "A call.", [("get_time", T)]),
]


def parse(parsing: OutputParsing, pieces: list[str]) -> list[ParsedDelta]:
    deltas = [parsing.feed(piece, False) for piece in pieces]
    deltas.append(parsing.feed("", True))
    return deltas


def assemble(deltas: list[ParsedDelta], prior: tuple[str, str, list[ToolCallDelta]] = (
        "", "", [])) -> tuple[str, str, list[tuple[str, str, str]]]:
    text, reasoning, calls = prior[0], prior[1], list(prior[2])
    for d in deltas:
        text += d.text
        reasoning += d.reasoning
        calls += d.tool_calls
    merged: dict[int, list[str]] = {}
    for call in calls:
        entry = merged.setdefault(call.index, ["", "", ""])
        if call.id is not None:
            assert not entry[0], "a call's header is sent once"
            entry[0], entry[1] = call.id, call.name or ""
        entry[2] += call.arguments
    return text, reasoning, [tuple(merged[i]) for i in sorted(merged)]  # type: ignore[misc]


def new(plan: ToolPlan | None, reasoning: str | None) -> OutputParsing:
    parsing = output_parsing_for(plan, reasoning, "job-1", 0)
    assert parsing is not None
    return parsing


def cut(text: str, points: list[int]) -> list[str]:
    bounds = [0, *sorted(p % (len(text) + 1) for p in points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("plan", "reasoning", "output", "text", "thought", "calls"), CASES)
def test_each_output_parses_to_its_parts(plan: ToolPlan | None, reasoning: str | None,
                                         output: str, text: str, thought: str,
                                         calls: list[tuple[str, str]]) -> None:
    parsing = new(plan, reasoning)
    got = assemble(parse(parsing, [output]))
    ids = [tool_call_id("job-1", 0, i) for i in range(len(calls))]
    assert got == (text, thought, [(i, n, a) for i, (n, a) in zip(ids, calls)])
    for _, arguments in calls:
        json.loads(arguments)
    assert parsing.finish_reason("stop") == (
        "tool_calls" if calls or (plan is not None and plan.mode in ("named", "required"))
        else "stop")
    assert parsing.finish_reason("length") == "length"


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(CASES), st.lists(st.integers(0, 10_000), max_size=12))
def test_any_cut_gives_the_same_result(case: Case, points: list[int]) -> None:
    plan, reasoning, output = case[:3]
    whole = assemble(parse(new(plan, reasoning), [output]))
    assert assemble(parse(new(plan, reasoning), cut(output, points))) == whole
    assert assemble(parse(new(plan, reasoning), list(output))) == whole


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_a_resume_at_any_point_sends_exactly_the_rest(case: Case) -> None:
    """What an attempt sent through character k, plus what a resumed parser sends after
    replaying those k characters, is what one undisturbed parser sends."""
    plan, reasoning, output = case[:3]
    whole = assemble(parse(new(plan, reasoning), list(output)))
    for k in range(len(output) + 1):
        first = new(plan, reasoning)
        sent = [first.feed(ch, False) for ch in output[:k]]
        sent_text, sent_reasoning = "".join(d.text for d in sent), "".join(
            d.reasoning for d in sent)
        sent_calls = [c for d in sent for c in d.tool_calls]
        resumed = new(plan, reasoning)
        resumed.resume(output[:k], sent_text, sent_reasoning, sent_calls)
        rest = parse(resumed, list(output[k:]))
        assert assemble(rest, (sent_text, sent_reasoning, sent_calls)) == whole, k


FRAGMENTS = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", ",", ":", ";", " ", "\n",
             '"name"', '"arguments"', '"parameters"', '"get_time"', '"get_weather"', '"',
             "\\", "1", "true", "x", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "get_time",
             "<|python_tag|>", "<think>", "</think>", "<", "é"]
PLANS = [(HERMES, None), (LLAMA, None), (MISTRAL, None), (NAMED, None), (REQUIRED, None),
         (None, "think"), (HERMES, "think")]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(PLANS), st.lists(st.sampled_from(FRAGMENTS), max_size=40),
       st.lists(st.integers(0, 10_000), max_size=8))
def test_any_output_parses_without_error_and_invents_nothing(
        plans: tuple[ToolPlan | None, str | None], fragments: list[str],
        points: list[int]) -> None:
    plan, reasoning = plans
    output = "".join(fragments)
    text, thought, calls = assemble(parse(new(plan, reasoning), [output]))
    assert assemble(parse(new(plan, reasoning), cut(output, points))) == (text, thought, calls)
    named_call = plan is not None and plan.mode == "named" and not output.strip()
    written = len(text) + len(thought) + sum(len(a) for _, _, a in calls)
    assert written <= len(output) or named_call  # an empty named call says "{}"
    for _, name, _ in calls:
        assert name in ("get_time", "get_weather")


def test_call_ids_differ_by_request_choice_and_place() -> None:
    ids = {tool_call_id(r, c, i) for r in ("a", "b") for c in (0, 1) for i in (0, 1)}
    assert len(ids) == 8
    assert tool_call_id("a", 0, 0) == tool_call_id("a", 0, 0)
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)


def test_plain_text_needs_no_parsers() -> None:
    assert output_parsing_for(None, None, "r", 0) is None
    assert output_parsing_for(ToolPlan(mode="none", tools=TOOLS), None, "r", 0) is None
    assert output_parsing_for(ToolPlan(mode="auto", tools=TOOLS), None, "r", 0) is None


def test_unknown_formats_are_refused() -> None:
    with pytest.raises(SamplingParamsError, match="format"):
        output_parsing_for(ToolPlan(mode="auto", format="xml"), None, "r", 0)
    with pytest.raises(SamplingParamsError, match="reasoning"):
        output_parsing_for(None, "brackets", "r", 0)
