"""A ``POST /v1/responses`` body -> SDK keywords, and the settings its answer echoes.

Every field is first checked against ``fields.REQUEST`` (unknown or refused: a 400 naming
it), then read with its type; the bounds of sampling fields are the SDK's, checked once
by ``kvrelay.protocol``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.responses_api.checks import convert, expect_object
from kvrelay.gateway.responses_api.fields import (
    REASONING,
    REQUEST,
    TEXT,
    TEXT_FORMAT,
    check_fields,
)
from kvrelay.gateway.responses_api.input_items import to_messages
from kvrelay.gateway.responses_api.tools import to_tool_choice, to_tools
from kvrelay.protocol import ReasoningEffort

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Asked by stateless clients to carry reasoning between turns: here the reasoning item's
# plain ``content`` does that (it is accepted back as input), so nothing is encrypted.
ENCRYPTED_REASONING_INCLUDE = "reasoning.encrypted_content"
_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)


class _Body(msgspec.Struct, kw_only=True):
    """The typed fields (the nested ones are read by their own modules).

    Not ``forbid_unknown_fields``: the body was already checked field by field against
    ``fields.py`` (an unknown field is a 400 there), and the no-ops and the refused
    fields holding an empty value (``store: false``) reach this struct and are ignored.
    """

    model: str
    input: Any
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    stream: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    max_tool_calls: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """What the endpoint needs: the SDK keywords, and what the answer echoes back."""

    model: str
    options: dict[str, Any]
    stream: bool
    logprobs: bool
    echo: dict[str, Any]


def parse_request(raw: bytes) -> ResponsesRequest:
    """Decode and check a body; a bad one is a 400 naming its field."""
    try:
        decoded = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    obj = expect_object(decoded, "body")
    check_fields(obj, REQUEST, "")
    if "input" not in obj:
        raise bad_request("input: required", "input")
    body = convert(obj, _Body, "")
    tools = to_tools(body.tools) if body.tools else []
    tool_choice: Any = None
    shown = tools
    if body.tool_choice is not None:
        tool_choice, shown = to_tool_choice(body.tool_choice, tools)
    options: dict[str, Any] = {"messages": to_messages(body.input, body.instructions)}
    if shown:
        options["tools"] = shown
    if tool_choice is not None:
        options["tool_choice"] = tool_choice
    if body.parallel_tool_calls is not None:
        options["parallel_tool_calls"] = body.parallel_tool_calls
    for name, key in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                      ("top_p", "top_p"), ("chat_template_kwargs", "chat_template_kwargs")):
        value = getattr(body, name)
        if value is not None:
            options[key] = value
    response_format = _response_format(body.text)
    if response_format is not None:
        options["response_format"] = response_format
    effort = _reasoning_effort(body.reasoning)
    if effort is not None:
        options["reasoning_effort"] = effort
    logprobs = _wants_logprobs(body.include)
    if logprobs:
        options["logprobs"] = body.top_logprobs or 0
    elif body.top_logprobs:
        raise bad_request(f"top_logprobs needs include: [{LOGPROBS_INCLUDE!r}]", "top_logprobs")
    return ResponsesRequest(model=body.model, options=options, stream=bool(body.stream),
                            logprobs=logprobs, echo=_echo(body))


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as the SDK's ``response_format`` (None: free text)."""
    if text is None:
        return None
    check_fields(text, TEXT, "text")
    if text.get("format") is None:
        return None
    fmt = expect_object(text["format"], "text.format")
    check_fields(fmt, TEXT_FORMAT, "text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        extra = sorted(set(fmt) - {"type"})
        if extra:
            raise bad_request(f"text.format.{extra[0]}: only a json_schema format takes it",
                              f"text.format.{extra[0]}")
        return None if kind == "text" else {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format.schema: required, a JSON Schema object",
                              "text.format.schema")
        if not isinstance(fmt.get("name"), str):  # required by OpenAI, and echoed back
            raise bad_request("text.format.name: required, a string", "text.format.name")
        spec = {k: fmt[k] for k in ("name", "schema", "description", "strict")
                if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": spec}
    raise bad_request(f"text.format.type: expected text, json_object or json_schema, got "
                      f"{kind!r}", "text.format.type")


def _reasoning_effort(reasoning: dict[str, Any] | None) -> str | None:
    if reasoning is None:
        return None
    check_fields(reasoning, REASONING, "reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise bad_request(f"reasoning.effort: expected one of {', '.join(_EFFORTS)}, got "
                          f"{effort!r}", "reasoning.effort")
    return effort


def _wants_logprobs(include: list[str] | None) -> bool:
    for i, value in enumerate(include or ()):
        if value not in (LOGPROBS_INCLUDE, ENCRYPTED_REASONING_INCLUDE):
            raise bad_request(f"include[{i}]: {value!r} is not supported (only "
                              f"{LOGPROBS_INCLUDE!r} and {ENCRYPTED_REASONING_INCLUDE!r})",
                              f"include[{i}]")
    return LOGPROBS_INCLUDE in (include or ())


def _echo(body: _Body) -> dict[str, Any]:
    """The request settings a Response object repeats (OpenAI's defaults where unset)."""
    text_format = (body.text or {}).get("format") or {"type": "text"}
    reasoning = body.reasoning or {}
    return {
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "parallel_tool_calls": True if body.parallel_tool_calls is None
        else body.parallel_tool_calls,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
        "tools": body.tools or [],
        "text": {"format": text_format, "verbosity": "medium"},
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "top_logprobs": body.top_logprobs or 0,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
        "previous_response_id": None,
        "store": False,
        "background": False,
        "truncation": "disabled",
        "service_tier": "default",
    }
