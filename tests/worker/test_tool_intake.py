"""A picked-up job's tools, tool choice and reasoning, as the worker's intake reads them.

The decode path is the worker's own (``decode_payload``, then ``sampling_params_from`` and
``prompt_ids_for``); the tokenizer is SmolLM2's, whose template knows no tools, and the
model's syntax comes from ``ModelParsers`` as the runtime resolves it from its settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvrelay.protocol import ErrorCode
from kvrelay_worker.engine.tools.model_parsers import ModelParsers
from kvrelay_worker.engine.tools.plan import ToolPlan
from kvrelay_worker.intake.job_request import (
    JobRejected,
    decode_payload,
    prompt_ids_for,
    sampling_params_from,
)
from kvrelay_worker.settings import SettingsError, WorkerSettings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"
HERMES = ModelParsers(tool_format="hermes", reasoning_format="think")
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OTHER = {"type": "function", "function": {"name": "local_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def decoded(**fields: Any) -> Any:
    payload = {"job_id": "j", "model": "m", **fields}
    if not {"prompt", "messages", "prompt_token_ids"} & fields.keys():
        payload["messages"] = ASK
    request, _ = decode_payload(json.dumps(payload), "j", "m", 1 << 20)
    return request


def plan_of(parsers: ModelParsers = HERMES, **fields: Any) -> ToolPlan | None:
    return sampling_params_from(decoded(**fields), parsers).tool_plan


def test_tool_choice_defaults_as_openai() -> None:
    assert plan_of() is None  # no tools, no choice: plain text
    assert plan_of(tool_choice="auto") is None  # nothing to call
    auto = plan_of(tools=[TOOL])
    assert auto is not None
    assert (auto.mode, auto.format, auto.parallel) == ("auto", "hermes", True)
    assert [t.function.name for t in auto.tools] == ["get_weather"]
    none = plan_of(tools=[TOOL], tool_choice="none")
    assert none is not None
    assert none.mode == "none"
    assert none.tools


def test_required_and_named_choices_carry_their_parts() -> None:
    required = plan_of(tools=[TOOL, OTHER], tool_choice="required", parallel_tool_calls=False)
    assert required is not None
    assert (required.mode, required.parallel, len(required.tools)) == ("required", False, 2)
    named = plan_of(tools=[TOOL, OTHER],
                    tool_choice={"type": "function", "function": {"name": "local_time"}})
    assert named is not None
    assert (named.mode, named.named) == ("named", "local_time")


def test_the_model_syntax_comes_from_the_parsers() -> None:
    plain = sampling_params_from(decoded(tools=[TOOL]), ModelParsers())
    assert plain.tool_plan is not None
    assert plain.tool_plan.format is None
    assert plain.reasoning_parser is None
    assert sampling_params_from(decoded(), HERMES).reasoning_parser == "think"


@pytest.mark.parametrize(("fields", "names"), [
    ({"tools": [TOOL], "tool_choice": "required",
      "sampling": {"response_format": {"type": "json_object"}}},
     ["'json_object'", "tool_choice 'required'"]),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "sampling": {"response_format": {"type": "regex", "pattern": "a+"}}},
     ["'regex'", "a named tool_choice"]),
    ({"prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}},
     ["chat_template_kwargs", "need messages"]),
    ({"prompt_token_ids": [1, 2], "reasoning_effort": "low"}, ["reasoning_effort"]),
])
def test_options_that_cannot_both_hold_are_refused(fields: dict[str, Any],
                                                   names: list[str]) -> None:
    with pytest.raises(JobRejected) as refused:
        sampling_params_from(decoded(**fields), HERMES)
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    for name in names:
        assert name in refused.value.message


def test_text_format_goes_with_a_forced_choice() -> None:
    plan = plan_of(tools=[TOOL], tool_choice="required",
                   sampling={"response_format": {"type": "text"}})
    assert plan is not None
    assert plan.mode == "required"


def test_a_follow_up_after_tool_results_renders_on_smollm2(tokenizer_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    request = decoded(tools=[TOOL], messages=[
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"}])
    ids = prompt_ids_for(request, tokenizer, len(tokenizer), 2048)
    text = str(tokenizer.decode(ids))
    assert '[{"name": "get_weather", "arguments": {"city": "Paris"}}]' in text
    assert text.endswith("<|im_start|>tool\n21 C<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(("messages", "kwargs", "phrase"), [
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "function": {"name": "get_weather", "arguments": "{"}}]}], {},
     "arguments are not valid JSON"),
    (ASK, {"chat_template_kwargs": {"enable_thinking": False}}, "does not read"),
    (ASK, {"chat_template_kwargs": {"add_generation_prompt": False}}, "may not set"),
])
def test_unrenderable_messages_are_invalid_requests(tokenizer_folder: Path,
                                                    messages: list[dict[str, Any]],
                                                    kwargs: dict[str, Any], phrase: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    with pytest.raises(JobRejected) as refused:
        prompt_ids_for(decoded(messages=messages, **kwargs), tokenizer, len(tokenizer), 2048)
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    assert phrase in refused.value.message


def test_parsers_follow_the_settings_over_the_template() -> None:
    qwen3 = (FIXTURES / "qwen3.jinja").read_text(encoding="utf-8")
    assert ModelParsers.resolve(qwen3) == ModelParsers("hermes", "think")
    assert ModelParsers.resolve(qwen3, "none", "none") == ModelParsers(None, None)
    assert ModelParsers.resolve("{{ messages }}", "mistral", "think") == ModelParsers(
        "mistral", "think")
    assert ModelParsers.resolve("{{ messages }}") == ModelParsers(None, None)


def test_parser_settings_are_checked_at_start() -> None:
    settings = WorkerSettings.from_env({"KVRELAY_TOOL_PARSER": "llama3_json",
                                        "KVRELAY_REASONING_PARSER": "none"})
    assert (settings.tool_parser, settings.reasoning_parser) == ("llama3_json", "none")
    assert WorkerSettings().tool_parser == "auto"
    with pytest.raises(SettingsError, match="KVRELAY_TOOL_PARSER must be one of auto, none, "
                                            "hermes, llama3_json, mistral, got 'xml'"):
        WorkerSettings.from_env({"KVRELAY_TOOL_PARSER": "xml"})
    with pytest.raises(SettingsError, match="KVRELAY_REASONING_PARSER"):
        WorkerSettings.from_env({"KVRELAY_REASONING_PARSER": "hermes"})
