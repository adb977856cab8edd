"""The grammars of tool plans accept exactly the call text ``tool_grammar`` documents.

Compiled by the engine's own ``GrammarCompiler`` over SmolLM2's tokenizer (with
``<tool_call>`` as one added token, as Qwen's has it); each text is fed to a matcher and
must then be able to end (EOS), or be refused somewhere on the way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvrelay.protocol import ResponseFormat, ToolSpec
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.sample.grammar import GrammarCompiler
from kvrelay_worker.engine.tools.plan import ToolPlan

EOS = 2
WEATHER = {"function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/City"},
                                     "days": {"type": "integer", "minimum": 1}},
    "required": ["city"], "$defs": {"City": {"type": "string", "maxLength": 8}}}}}
ADD = {"function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
PING = {"function": {"name": "ping"}}  # no parameters: any object
TOOLS = tuple(msgspec.convert([WEATHER, ADD, PING], list[ToolSpec]))
PARIS = '{"city": "Paris"}'
SUM = '{"a": 1, "b": 2}'


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    loaded.add_tokens(["<tool_call>", "</tool_call>"])
    return loaded


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), [EOS])


def plan(mode: str, fmt: str | None = None, parallel: bool = True,
         named: str | None = None, tools: tuple[ToolSpec, ...] = TOOLS) -> ToolPlan:
    return ToolPlan(mode=mode, tools=tools, named=named, parallel=parallel,  # type: ignore[arg-type]
                    format=fmt)


def accepts(grammars: GrammarCompiler, compiled: Any, text: str) -> bool:
    """Whether ``text`` followed by EOS is a whole output under the grammar."""
    matcher = grammars.matcher(compiled).matcher
    return bool(matcher.accept_string(text) and matcher.accept_token(EOS))


def test_required_is_a_compact_array_of_known_calls(grammars: GrammarCompiler) -> None:
    compiled = grammars.compile(None, plan("required"))
    good = [f'[{{"name": "get_weather", "arguments": {PARIS}}}]',
            f'[{{"name": "add", "arguments": {SUM}}}, {{"name": "ping", "arguments": {{}}}}]',
            '[{"name": "ping", "arguments": {"anything": [1, "x"]}}]',
            '[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}]']
    bad = ['[]', '', 'Sure.', f'[{{"name": "nope", "arguments": {PARIS}}}]',
           f'[{{"name": "add", "arguments": {PARIS}}}]',  # another tool's arguments
           '[{"name": "add", "arguments": {"a": 1}}]',  # a required key missing
           '[{"name": "get_weather", "arguments": {"city": "Amsterdam!"}}]',  # $ref's maxLength
           f'[{{"arguments": {SUM}, "name": "add"}}]',  # keys in another order
           f'[{{"name":"add","arguments":{SUM}}}]',  # not the documented spacing
           f'[{{"name": "add", "arguments": {SUM}, "id": "x"}}]',
           f'[{{"name": "add", "arguments": {SUM}}}]\n']
    assert [accepts(grammars, compiled, t) for t in good] == [True] * len(good)
    assert [accepts(grammars, compiled, t) for t in bad] == [False] * len(bad)


def test_required_without_parallel_calls_once(grammars: GrammarCompiler) -> None:
    compiled = grammars.compile(None, plan("required", parallel=False))
    assert accepts(grammars, compiled, f'[{{"name": "add", "arguments": {SUM}}}]')
    assert not accepts(grammars, compiled,
                       f'[{{"name": "add", "arguments": {SUM}}}, {{"name": "ping", '
                       '"arguments": {}}]')


def test_named_is_the_arguments_alone(grammars: GrammarCompiler) -> None:
    compiled = grammars.compile(None, plan("named", named="add"))
    assert accepts(grammars, compiled, SUM)
    for text in ['{"a":1,"b":2}', '{"name": "add", "arguments": ' + SUM + "}", PARIS,
                 '{"a": 1, "b": 2, "c": 3}']:
        assert not accepts(grammars, compiled, text), text
    ping = grammars.compile(None, plan("named", named="ping"))
    assert accepts(grammars, ping, '{"x": [true]}')
    assert not accepts(grammars, ping, "[1]")


NATIVE = {
    "hermes": (f'<tool_call>\n{{"name": "add", "arguments": {SUM}}}\n</tool_call>',
               f'<tool_call>\n{{"name": "nope", "arguments": {SUM}}}\n</tool_call>'),
    "llama3_json": (f'{{"name": "add", "parameters": {SUM}}}',
                    f'{{"name": "add", "parameters": {PARIS}}}'),
    "mistral": (f'[TOOL_CALLS][{{"name": "add", "arguments": {SUM}}}]',
                f'[TOOL_CALLS][{{"name": "add", "arguments": {PARIS}}}]'),
}


@pytest.mark.parametrize("fmt", list(NATIVE))
def test_auto_leaves_text_free_until_a_call_opens(grammars: GrammarCompiler, fmt: str) -> None:
    call, wrong = NATIVE[fmt]
    compiled = grammars.compile(None, plan("auto", fmt))
    assert accepts(grammars, compiled, "The weather is fine, no call needed.")
    assert accepts(grammars, compiled, "Let me check. " + call)
    assert not accepts(grammars, compiled, "Let me check. " + wrong)
    once = grammars.compile(None, plan("auto", fmt, parallel=False))
    assert accepts(grammars, once, call)
    assert not accepts(grammars, once, call + " and more text")


def test_mistral_also_takes_the_name_then_args_form(grammars: GrammarCompiler) -> None:
    compiled = grammars.compile(None, plan("auto", "mistral"))
    assert accepts(grammars, compiled, f"[TOOL_CALLS]add[ARGS]{SUM}[TOOL_CALLS]ping[ARGS]{{}}")
    assert not accepts(grammars, compiled, f"[TOOL_CALLS]add[ARGS]{PARIS}")


def test_auto_with_a_response_format_is_one_or_the_other(grammars: GrammarCompiler) -> None:
    fmt = msgspec.convert({"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"]}}}, ResponseFormat)
    compiled = grammars.compile(fmt, plan("auto", "hermes"))
    call = NATIVE["hermes"][0]
    assert accepts(grammars, compiled, '{"answer": "sunny"}')
    assert accepts(grammars, compiled, call + "\n" + call)
    for text in ["free text", '{"answer": "sunny"}' + call, '{"other": 1}']:
        assert not accepts(grammars, compiled, text), text
    with pytest.raises(SamplingParamsError, match="response_format and tool_choice 'named'"):
        grammars.compile(fmt, plan("named", named="add"))


def test_the_cache_tells_tools_apart(grammars: GrammarCompiler) -> None:
    """Same name, another schema: another grammar (the key holds every schema)."""
    numbers = msgspec.convert([{"function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "integer"}},
        "required": ["city"]}}}], list[ToolSpec])
    text = '[{"name": "get_weather", "arguments": {"city": 7}}]'
    assert not accepts(grammars, grammars.compile(None, plan("required")), text)
    assert accepts(grammars, grammars.compile(None, plan("required", tools=tuple(numbers))), text)


def test_no_grammar_without_a_constraint(grammars: GrammarCompiler) -> None:
    assert grammars.compile(None, plan("auto")) is None  # no native format
    assert grammars.compile(None, plan("none", "hermes")) is None
    assert grammars.compile(None, plan("required", tools=())) is None


def test_a_parameters_schema_must_describe_an_object(grammars: GrammarCompiler) -> None:
    scalar = msgspec.convert([{"function": {"name": "f", "parameters": {"type": "string"}}}],
                             list[ToolSpec])
    with pytest.raises(SamplingParamsError, match="'f' must describe a JSON object"):
        grammars.compile(None, plan("required", tools=tuple(scalar)))
    broken = msgspec.convert([{"function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}}}], list[ToolSpec])
    with pytest.raises(SamplingParamsError, match="cannot be compiled"):
        grammars.compile(None, plan("named", named="f", tools=tuple(broken)))


def test_a_resumed_call_replays_through_the_matcher(grammars: GrammarCompiler,
                                                    tokenizer: Any) -> None:
    """Failover: the tokens sent before go through a fresh matcher, mid-call."""
    compiled = grammars.compile(None, plan("auto", "hermes"))
    head = tokenizer.encode('Checking. <tool_call>\n{"name": "add", "arguments": {"a": 1',
                            add_special_tokens=False)
    grammar = grammars.matcher(compiled, head)
    assert grammar.matcher.accept_string(', "b": 2}}\n</tool_call>')
    assert not grammars.matcher(compiled, head).matcher.accept_string(', "c": 2')
    with pytest.raises(SamplingParamsError, match="cannot resume"):
        grammars.matcher(compiled, tokenizer.encode(
            '<tool_call>\n{"name": "nope"', add_special_tokens=False))
