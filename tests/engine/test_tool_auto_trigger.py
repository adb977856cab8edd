"""``tool_choice="auto"``: free text until the model opens a call, then a valid call.

A tiny random model with Qwen3's (hermes) template and ``<tool_call>``/``</tool_call>`` as
single tokens, as Qwen's vocabulary has them. A logit bias makes the model open a call
at once; a random model then writes noise, so only the trigger-activated grammar can
make what follows the named tool's valid arguments and a closed tag. A failover resume
mid-call (the matcher replaying the delivered tokens) continues token for token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from helpers.engine_run import assert_engine_idle, one_torch_thread
from helpers.tiny_models import build_tiny_model

from kvrelay.protocol import ToolSpec
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.tools.plan import ToolPlan

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"
TOOLS_JSON: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                         "days": {"type": "integer", "minimum": 1,
                                                  "maximum": 7}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 9},
                                         "b": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["a", "b"]}}},
]
TOOLS = tuple(msgspec.convert(TOOLS_JSON, list[ToolSpec]))
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS_JSON}
CALL = re.compile(r'<tool_call>\n\{"name": "([a-z_]+)", "arguments": (.*?)\}\n</tool_call>',
                  re.DOTALL)
ASK = [{"role": "user", "content": "Weather in Oslo for three days?"}]


@pytest.fixture(scope="module")
def llm(tokenizer_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLM]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("hermes-tiny")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = (FIXTURES / "qwen3.jinja").read_text(encoding="utf-8")
    tokenizer.save_pretrained(str(root / "tokenizer"))
    folder = build_tiny_model("llama-mqa", root / "model", tokenizer_folder=root / "tokenizer",
                              vocab_size=len(tokenizer))
    with one_torch_thread():
        yield LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=512)


def params(llm: LLM, parallel: bool, plan: bool = True, **extra: Any) -> SamplingParams:
    opener = llm.tokenizer.convert_tokens_to_ids("<tool_call>")
    tool_plan = ToolPlan(mode="auto", tools=TOOLS, parallel=parallel, format="hermes")
    return SamplingParams(temperature=1.0, max_tokens=160, logit_bias={opener: 100.0},
                          tool_plan=tool_plan if plan else None, **extra)


def raw_texts(llm: LLM, sampling: SamplingParams) -> list[tuple[str, list[int], str | None]]:
    (out,) = llm.chat(ASK, sampling, tools=TOOLS_JSON)
    return [(llm.tokenizer.decode(c.token_ids, skip_special_tokens=True), c.token_ids,
             c.finish_reason) for c in out.choices]


def valid_calls(text: str) -> list[str]:
    """The names of the text's complete calls, each with arguments valid for its tool."""
    names = []
    for name, arguments in CALL.findall(text):
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        names.append(name)
    return names


def test_an_opened_call_is_a_valid_call(llm: LLM) -> None:
    for text, _, finish_reason in raw_texts(llm, params(llm, parallel=False, seed=4, n=4)):
        assert text.startswith("<tool_call>\n"), text
        assert len(valid_calls(text)) == 1, text
        assert CALL.fullmatch(text), text  # nothing after the one call: parallel is off
        assert finish_reason in ("stop", "tool_calls")
    assert_engine_idle(llm.engine)


def test_parallel_calls_each_validate(llm: LLM) -> None:
    """After a call the text is free again; the bias opens the next one."""
    for text, _, _ in raw_texts(llm, params(llm, parallel=True, seed=5, n=2)):
        assert len(valid_calls(text)) >= 2, text


def test_without_the_grammar_the_model_writes_noise(llm: LLM) -> None:
    for text, _, _ in raw_texts(llm, params(llm, parallel=False, plan=False, seed=4, n=4)):
        assert text.startswith("<tool_call>")
        assert not CALL.search(text), text


def test_a_resumed_call_continues_token_for_token(llm: LLM) -> None:
    sampling = params(llm, parallel=False, seed=6)
    ((_, full, _),) = raw_texts(llm, sampling)
    head = full[:9]  # inside the call: the tag, the name, part of the arguments
    assert llm.tokenizer.decode(head).startswith('<tool_call>\n{"name": "')
    engine = llm.engine
    prompt = engine.tokenizer.apply_chat_template(ASK, tools=TOOLS_JSON,
                                                  add_generation_prompt=True, tokenize=False)
    engine.add_request("resumed", engine.tokenizer.encode(prompt, add_special_tokens=False),
                       sampling, prior_outputs=[head], prior_texts=[llm.tokenizer.decode(head)])
    resumed: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.output is not None:
                resumed = out.output.choices[0].token_ids
    assert resumed == full
    assert_engine_idle(engine)
