"""Chat messages checked and shaped for a model's chat template.

Messages arrive in OpenAI's shape (the wire's ``ChatMessage``, or the same mappings from
the offline API): ``role``, ``content`` (None for an assistant turn that only calls
tools), ``name``, ``tool_calls`` with each call's ``arguments`` as JSON text,
``tool_call_id`` and ``reasoning_content``. Templates expect what transformers' tool-use
guide passes instead: each call as ``{"type": "function", "function": {"name": ...,
"arguments": {...}}}`` with the arguments as a mapping (Llama's templates ``tojson``
them; Qwen's would print a string as it is). So the arguments are parsed here, and text
that is not a JSON object is refused, naming the message and the call.

A None content becomes empty text: transformers drops None keys, and templates read
``content`` unguarded (Qwen3's tests ``'</think>' in message.content`` on every
assistant turn).

A template that knows nothing of tool calls (no ``tool_calls`` in its text, as
SmolLM2's ChatML template) would drop an assistant's calls, leaving an empty turn. For
those templates the calls are written into the message's content, after any text, as
one JSON array of ``{"name": ..., "arguments": {...}}`` objects: the very text a
``tool_choice="required"`` answer is decoded as (``engine/tools/tool_grammar.py``), so
the model sees its earlier calls as it wrote them. ``tool`` results keep their role and
content, which a ChatML template renders as a ``tool`` turn; a follow-up turn after a
tool result then renders on any template that renders every role.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvrelay_worker.engine.errors import InvalidPromptError

ROLES = ("system", "user", "assistant", "tool")
_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"})
# Only an assistant may send no content (it called tools, or only reasoned).
_CONTENT_OPTIONAL = ("assistant",)


def template_knows_tool_calls(chat_template: str | None) -> bool:
    """Whether the template renders an assistant's ``tool_calls`` itself."""
    return bool(chat_template) and "tool_calls" in str(chat_template)


def calls_as_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant's calls as the JSON array a template without tool support shows."""
    return json.dumps([{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                       for c in calls], ensure_ascii=False)


def template_messages(messages: object, knows_tool_calls: bool = True) -> list[dict[str, Any]]:
    """``messages`` checked and shaped for the template; ``InvalidPromptError`` names the
    first message that is wrong and why."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidPromptError("messages must be a non-empty list of {role, content} mappings")
    return [_message(i, m, knows_tool_calls) for i, m in enumerate(messages)]


def _message(i: int, message: object, knows_tool_calls: bool) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise InvalidPromptError(f"message {i} must be a mapping with role and content")
    unknown = sorted(str(k) for k in message if k not in _KEYS)
    if unknown:
        raise InvalidPromptError(f"message {i} has unknown keys {unknown}; a message has "
                                 f"{sorted(_KEYS)}")
    role = message.get("role")
    if role not in ROLES:
        raise InvalidPromptError(f"message {i} has role {role!r}; expected one of {ROLES}")
    content = message.get("content")
    if content is None and role not in _CONTENT_OPTIONAL:
        raise InvalidPromptError(f"message {i} ({role}) must have content")
    if content is not None and not isinstance(content, str):
        raise InvalidPromptError(f"message {i} content must be a string")
    shaped: dict[str, Any] = {"role": role, "content": content or ""}
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidPromptError(f"message {i} {key} must be a string")
        shaped[key] = value
    if "reasoning_content" in shaped and role != "assistant":
        raise InvalidPromptError(f"message {i} ({role}) cannot carry reasoning_content; "
                                 "only an assistant reasons")
    if "tool_call_id" in shaped and role != "tool":
        raise InvalidPromptError(f"message {i} ({role}) cannot carry tool_call_id; only a "
                                 "tool result answers a call")
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InvalidPromptError(f"message {i} ({role}) cannot carry tool_calls; only an "
                                     "assistant calls tools")
        shaped["tool_calls"] = _calls(i, calls)
    if not knows_tool_calls:
        _inline_calls(shaped)
    return shaped


def _calls(i: int, calls: object) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise InvalidPromptError(f"message {i} tool_calls must be a list")
    return [_call(i, j, call) for j, call in enumerate(calls)]


def _call(i: int, j: int, call: object) -> dict[str, Any]:
    where = f"message {i} tool call {j}"
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise InvalidPromptError(f"{where} must be {{id, type: function, function: {{name, "
                                 "arguments}}}}")
    assert isinstance(call, Mapping)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidPromptError(f"{where} needs a function name")
    shaped: dict[str, Any] = {"type": "function",
                              "function": {"name": name,
                                           "arguments": _arguments(where, name, function)}}
    call_id = call.get("id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise InvalidPromptError(f"{where} id must be a string")
        shaped = {"id": call_id, **shaped}
    return shaped


def _arguments(where: str, name: str, function: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments as a mapping: JSON text parsed (the wire's form), or a mapping
    the offline API was given."""
    arguments = function.get("arguments")
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise InvalidPromptError(f"{where} ({name!r}) arguments must be JSON text")
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        raise InvalidPromptError(f"{where} ({name!r}) arguments are not valid JSON: "
                                 f"{str(exc)[:200]}") from None
    if not isinstance(parsed, dict):
        raise InvalidPromptError(f"{where} ({name!r}) arguments must be a JSON object, got "
                                 f"{type(parsed).__name__}")
    return parsed


def _inline_calls(shaped: dict[str, Any]) -> None:
    """For a template without tool support: calls into the content, no None content."""
    calls = shaped.pop("tool_calls", None)
    text = shaped["content"]
    if calls:
        text = f"{text}\n{calls_as_text(calls)}" if text else calls_as_text(calls)
    shaped["content"] = text
