"""Forced tool choices on the real SmolLM2-135M-Instruct: calls that always validate.

SmolLM2's template knows no tools, so only the grammar (``engine/tools/tool_grammar.py``)
makes its answers calls: a named choice must decode to that tool's arguments, a required
choice to the documented JSON array of known tools with valid arguments, and one call
only when parallel calls are off. The text is read from the sampled token ids, so the
check does not depend on the output parsers. Float32 weights on CPU, greedy and seeded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from helpers.engine_run import assert_engine_idle, one_torch_thread

from kvrelay.protocol import ToolSpec
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.tools.plan import ToolPlan

pytestmark = pytest.mark.slow

TOOLS_JSON: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
            "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 40},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"]}}},
]
TOOLS = tuple(msgspec.convert(TOOLS_JSON, list[ToolSpec]))
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS_JSON}
PROMPTS = {
    "get_weather": "What is the weather like in Paris today?",
    "add": "What is 17 plus 25?",
    "search": "Find me recent news about llamas.",
}
# Greedy, then a seeded sample.
SAMPLING = [{"temperature": 0.0}, {"temperature": 1.0, "seed": 1}]


@pytest.fixture(scope="module")
def llm(smollm2_folder: Path) -> Any:
    with one_torch_thread():
        yield LLM(str(smollm2_folder), device="cpu", dtype="float32", num_kv_blocks=512)


def run(llm: LLM, plan: ToolPlan, **sampling: Any) -> list[tuple[str, str | None]]:
    """Every prompt at once: the raw text and finish reason of each choice."""
    params = SamplingParams(max_tokens=120, tool_plan=plan, **sampling)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS.values()]
    outputs = llm.chat(conversations, params, tools=TOOLS_JSON)
    return [(llm.tokenizer.decode(c.token_ids, skip_special_tokens=True), c.finish_reason)
            for out in outputs for c in out.choices]


def check_call(item: Any) -> str:
    assert isinstance(item, dict), item
    assert list(item) == ["name", "arguments"], item
    jsonschema.validate(item["arguments"], SCHEMAS[item["name"]])
    return str(item["name"])


def read_calls(text: str, finish_reason: str | None) -> list[Any]:
    """The array's calls, each checked; a greedy small model may go on calling until the
    length cap, so a cut array gives the calls it completed (at least one)."""
    decoder = json.JSONDecoder()
    assert text.startswith("["), text
    calls: list[Any] = []
    at = 1
    while True:
        try:
            call, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            assert finish_reason == "length", text
            assert calls, text
            return calls
        check_call(call)
        calls.append(call)
        if text[at:] == "]":
            assert finish_reason in ("stop", "tool_calls"), finish_reason
            return calls
        if text[at:at + 2] != ", ":
            assert finish_reason == "length", text
            assert text[at:] in ("", ","), text
            return calls
        at += 2


def test_a_named_choice_gives_that_tools_arguments(llm: LLM) -> None:
    for name in PROMPTS:
        plan = ToolPlan(mode="named", tools=TOOLS, named=name)
        for sampling in SAMPLING:
            for text, finish_reason in run(llm, plan, **sampling):
                # Ended by the grammar ("tool_calls" once the parsers read the call).
                assert finish_reason in ("stop", "tool_calls"), (finish_reason, text)
                jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_a_required_choice_gives_valid_calls(llm: LLM) -> None:
    plan = ToolPlan(mode="required", tools=TOOLS)
    for sampling in SAMPLING:
        for text, finish_reason in run(llm, plan, **sampling):
            read_calls(text, finish_reason)


def test_required_without_parallel_calls_gives_exactly_one(llm: LLM) -> None:
    plan = ToolPlan(mode="required", tools=TOOLS, parallel=False)
    results = run(llm, plan, temperature=1.0, seed=3, n=3)
    assert len(results) == 3 * len(PROMPTS)
    for text, finish_reason in results:
        assert finish_reason in ("stop", "tool_calls"), (finish_reason, text)
        calls = json.loads(text)
        assert isinstance(calls, list), text
        assert len(calls) == 1, text
        check_call(calls[0])
    assert_engine_idle(llm.engine)
