"""What ``POST /v1/responses`` does with every field it can be sent: the one classification.

Each field of a request (and of the objects inside it: tools, items, content parts, the
``text`` and ``reasoning`` settings) is *honoured* (it changes the job or the answer), a
*no-op* (accepted, changes nothing here, and the reason is written down), or *refused*
(a 400 naming it) unless it holds a value that asks for nothing (``store: false``,
``truncation: "disabled"``, an empty list). A field that is none of these is unknown: a
400 naming it too. ``tests/gateway/test_responses_fields.py`` checks that every field of
the installed ``openai`` package's request types is classified here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.fields import Handling, Rule, honoured, no_op, refused

_NO_STORE = "kvrelay stores no responses (the endpoint is stateless)"

# The body of ``POST /v1/responses`` (openai's ``ResponseCreateParams``, and kvrelay's extras).
REQUEST: Mapping[str, Rule] = {
    "model": honoured("the model workers serve"),
    "input": honoured("a string, or `message` / `function_call` / "
                      "`function_call_output` / `reasoning` items, rendered with the "
                      "model's chat template; other item types are refused"),
    "instructions": honoured("a system message before the input"),
    "tools": honoured("function tools; other tool types are refused"),
    "tool_choice": honoured('`"auto"`, `"none"`, `"required"`, a function, or '
                            "`allowed_tools` naming functions (the model sees only those)"),
    "parallel_tool_calls": honoured("`false`: at most one call per answer"),
    "text": honoured("`format`: `text`, `json_object` or `json_schema` (structured output)"),
    "reasoning": honoured("`effort`: the chat template's `reasoning_effort` (`none` to "
                          "`high`); `summary` is a no-op"),
    "max_output_tokens": honoured("most tokens of the answer; reaching it ends an "
                                  "`incomplete` response"),
    "temperature": honoured("0 is greedy"),
    "top_p": honoured("nucleus sampling"),
    "top_logprobs": honoured("alternatives per token, 0 to 20 (with `include`)"),
    "include": honoured('`"message.output_text.logprobs"`: log-probabilities on '
                        '`output_text`; `"reasoning.encrypted_content"` is a no-op '
                        "(reasoning items carry their text, accepted back as input); "
                        "other values are refused"),
    "stream": honoured("Server-Sent Events with OpenAI's event names"),
    "metadata": no_op("echoed in the response, stored nowhere"),
    "user": no_op("an end-user tag for OpenAI's abuse detection"),
    "safety_identifier": no_op("an end-user tag for OpenAI's abuse detection"),
    "prompt_cache_key": no_op("the prefix cache needs no key: it matches prefixes of the "
                              "same tenant by content"),
    "prompt_cache_retention": no_op("prefix-cache entries live while KV blocks allow"),
    "max_tool_calls": no_op("bounds calls to built-in tools, and there are none"),
    "image": no_op("image options; image inputs are refused"),
    "stream_options": no_op("`include_obfuscation`: no padding is added"),
    "service_tier": refused("kvrelay has one service tier", "auto", "default"),
    "store": refused(_NO_STORE, False),
    "previous_response_id": refused(_NO_STORE + ": send the earlier items in `input`"),
    "conversation": refused(_NO_STORE + ": send the earlier items in `input`"),
    "background": refused("a response runs while its request is open", False),
    "background_options": refused("a response runs while its request is open", {}),
    "prompt": refused("stored prompt templates do not exist here"),
    "truncation": refused("an input longer than the context is refused, never cut",
                          "disabled"),
    "context_management": refused("compaction needs stored conversations", []),
    "prompt_cache_options": refused("the prefix cache has no breakpoints or prewarming",
                                    {}),
    "moderation": refused("kvrelay runs no moderation model"),
    "access_programs": refused("OpenAI's access programs do not exist here", {},
                               {"cyber": "standard"}),
    "chat_template_kwargs": honoured("kvrelay: extra variables for the chat template "
                                     "(`enable_thinking`, ...)"),
}
# Fields of ``REQUEST`` that are kvrelay's, not OpenAI's.
EXTRAS: frozenset[str] = frozenset({"chat_template_kwargs"})

# One entry of ``tools`` of type "function" (the Responses flat form).
FUNCTION_TOOL: Mapping[str, Rule] = {
    "type": honoured('"function"'),
    "name": honoured("the function's name"),
    "description": honoured("rendered with the tool"),
    "parameters": honoured("the JSON Schema of the arguments (the grammar of forced calls)"),
    "strict": honoured("carried with the tool to the worker"),
    "output_schema": no_op("describes what the function returns; templates render no "
                           "output schema"),
    "defer_loading": refused("tool search does not exist here", False),
    "allowed_callers": refused("only the model calls tools here", ["direct"]),
    "async": refused("calls are answered in the next request", False),
}

TEXT: Mapping[str, Rule] = {
    "format": honoured("text, json_object or json_schema"),
    "verbosity": refused("the model's verbosity is not adjustable", "medium"),
}

TEXT_FORMAT: Mapping[str, Rule] = {
    "type": honoured('"text", "json_object" or "json_schema"'),
    "name": honoured("the schema's name"),
    "schema": honoured("the JSON Schema the output must match"),
    "description": honoured("carried with the schema"),
    "strict": honoured("carried with the schema (the grammar enforces it either way)"),
}

REASONING: Mapping[str, Rule] = {
    "effort": honoured("the chat template's reasoning_effort"),
    "summary": no_op("the reasoning is returned whole, as reasoning_text; never summarised"),
    "generate_summary": no_op("the reasoning is returned whole, as reasoning_text"),
    "context": refused("the chat template decides which earlier reasoning it renders",
                       "auto"),
    "mode": refused("one reasoning mode", "standard"),
}

TOOL_CHOICE_FUNCTION: Mapping[str, Rule] = {
    "type": honoured('"function"'),
    "name": honoured("the function the model must call"),
}

TOOL_CHOICE_ALLOWED: Mapping[str, Rule] = {
    "type": honoured('"allowed_tools"'),
    "mode": honoured('"auto" or "required" among the allowed functions'),
    "tools": honoured("the functions the model is shown"),
}

_ITEM_ID = no_op("ids of earlier items identify nothing here (nothing is stored)")
_ITEM_STATUS = no_op("the status of an earlier item changes nothing")
_DIRECT_CALLER = refused("only the model calls tools here", {"type": "direct"})

# Input items, by ``type`` (a message may leave ``type`` out).
ITEMS: Mapping[str, Mapping[str, Rule]] = {
    "message": {
        "type": honoured('"message"'),
        "role": honoured("user, system, developer (as system) or assistant"),
        "content": honoured("a string or text parts"),
        "id": _ITEM_ID,
        "status": _ITEM_STATUS,
        "phase": no_op("commentary / final answer marks of OpenAI models"),
    },
    "function_call": {
        "type": honoured('"function_call"'),
        "call_id": honoured("the call's id, answered by a function_call_output"),
        "name": honoured("the function called"),
        "arguments": honoured("the arguments, JSON text"),
        "id": _ITEM_ID,
        "status": _ITEM_STATUS,
        "namespace": refused("tool namespaces do not exist here"),
        "caller": _DIRECT_CALLER,
        "async": refused("calls are answered in the next request", False),
    },
    "function_call_output": {
        "type": honoured('"function_call_output"'),
        "call_id": honoured("the call this output answers"),
        "output": honoured("a string or text parts: a tool message"),
        "name": honoured("the function's name on the tool message"),
        "id": _ITEM_ID,
        "status": _ITEM_STATUS,
        "namespace": refused("tool namespaces do not exist here"),
        "caller": _DIRECT_CALLER,
    },
    "reasoning": {
        "type": honoured('"reasoning"'),
        "content": honoured("reasoning_content of the next assistant turn"),
        "summary": honoured("reasoning_content of the next assistant turn, without content"),
        "id": _ITEM_ID,
        "status": _ITEM_STATUS,
        "encrypted_content": refused("kvrelay never encrypts reasoning: send content"),
    },
}

# Content parts of message items and function_call_output items, by ``type``.
PARTS: Mapping[str, Mapping[str, Rule]] = {
    "input_text": {
        "type": honoured('"input_text"'),
        "text": honoured("the text"),
        "prompt_cache_breakpoint": no_op("prefix caching here needs no breakpoints"),
    },
    "output_text": {
        "type": honoured('"output_text"'),
        "text": honoured("the text"),
        "annotations": no_op("citations of earlier output"),
        "logprobs": no_op("log-probabilities of earlier output"),
    },
    "refusal": {
        "type": honoured('"refusal"'),
        "refusal": honoured("the text of an assistant's refusal"),
    },
}

# Reasoning content and summary parts.
REASONING_PARTS: Mapping[str, Mapping[str, Rule]] = {
    "reasoning_text": {"type": honoured('"reasoning_text"'), "text": honoured("the text")},
    "summary_text": {"type": honoured('"summary_text"'), "text": honoured("the text")},
}


def check_fields(obj: Mapping[str, Any], rules: Mapping[str, Rule], where: str) -> None:
    """400 naming the first field of ``obj`` that is unknown, or refused and not inert."""
    for name, value in obj.items():
        param = f"{where}.{name}" if where else name
        rule = rules.get(name)
        if rule is None:
            raise bad_request(f"{param}: unknown field", param)
        if rule.handling is Handling.REFUSED and not _is_inert(value, rule.inert):
            raise bad_request(f"{param} is not supported: {rule.why}", param)


def _is_inert(value: Any, inert: tuple[Any, ...]) -> bool:
    # bool is an int: compare types too, so 0 is not taken for False (nor 1 for True).
    return any(value == v and type(value) is type(v) for v in inert)


def markdown_table() -> str:
    """The docs table of the body's fields (docs/http-api.md holds it verbatim)."""
    lines = ["| field | handling | what it does, or why not |", "|---|---|---|"]
    for name, rule in REQUEST.items():
        handling = rule.handling.value
        asks = [repr(v) for v in rule.inert if v is not None]
        if asks:
            handling += f" (unless {', '.join(asks)})".replace("'", '"')
        lines.append(f"| `{name}` | {handling} | {rule.why} |")
    return "\n".join(lines)
