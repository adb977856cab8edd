"""Chat keywords -> wire types: messages (with tool calls and their results), ``tools``,
``tool_choice``, ``parallel_tool_calls``, ``chat_template_kwargs``, ``reasoning_effort``.

Each takes OpenAI's dict form (what an ``openai`` caller already holds) or the protocol's
struct, and fails with ``InvalidRequest`` naming the keyword and the place inside it,
before anything is enqueued. The wire structs keep unknown keys quietly (peers of
another version must read each other), so the keys are checked here: a key this
version does not carry is refused, never dropped. The gateway validates its bodies
through these functions too, so both doors accept the same conversations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, get_args

import msgspec

from kvrelay.errors import InvalidRequest
from kvrelay.protocol import (
    MAX_TOOLS,
    ChatMessage,
    FunctionCall,
    FunctionSpec,
    NamedToolChoice,
    ReasoningEffort,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

__all__ = ["ChatFields", "chat_fields_from", "messages_from", "tool_choice_from", "tools_from"]

_T = TypeVar("_T")

TOOL_CHOICE_WORDS: Final = ("auto", "none", "required")
REASONING_EFFORTS: Final[tuple[str, ...]] = get_args(ReasoningEffort)
# Keywords that only a chat template reads: refused with a plain prompt.
TEMPLATE_KEYWORDS: Final = ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort")

_MESSAGE_KEYS: Final = frozenset(ChatMessage.__struct_fields__)
_TOOL_KEYS: Final = frozenset(ToolSpec.__struct_fields__)
_FUNCTION_KEYS: Final = frozenset(FunctionSpec.__struct_fields__)
_CALL_KEYS: Final = frozenset(ToolCall.__struct_fields__)
_CALL_FUNCTION_KEYS: Final = frozenset(FunctionCall.__struct_fields__)
_CHOICE_KEYS: Final = frozenset(NamedToolChoice.__struct_fields__)
_TEXT_PART_KEYS: Final = frozenset({"type", "text"})


@dataclass(frozen=True, slots=True)
class ChatFields:
    """The request fields a chat template reads besides the messages."""

    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None


# ----------------------------------------------------------------------- primitives


def _convert(value: object, kind: type[_T], where: str) -> _T:
    """``msgspec.convert`` whose error names ``where`` and the path inside it."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message, sep, at = str(exc).rpartition(" - at ")
        if not sep:
            raise InvalidRequest(f"{where}: {exc}") from None
        path = at.strip("`").removeprefix("$")
        raise InvalidRequest(f"{where}{path}: {message[:1].lower()}{message[1:]}") from None


def _as_dict(value: object, where: str, allowed: frozenset[str],
             *, functions_only: bool = False) -> dict[str, Any]:
    """A mapping (or a wire struct) as a dict, refusing keys that are not ``allowed``
    (and, with ``functions_only``, a ``type`` other than "function", named first)."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where} must be a dict, got {type(value).__name__}")
    kind = value.get("type", "function")
    if functions_only and kind != "function":
        raise InvalidRequest(f"{where}.type: only 'function' is supported, got {kind!r}")
    extra = sorted(str(k) for k in value if k not in allowed)
    if extra:
        raise InvalidRequest(f"{where} has unsupported keys {extra} "
                             f"(accepted: {', '.join(sorted(allowed))})")
    return dict(value)


def _list(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidRequest(f"{where} must be a list, got {type(value).__name__}")
    return value


# ------------------------------------------------------------------------- messages


def _content(value: object, where: str) -> str:
    """A message's text: a string, or OpenAI's list of text parts (joined)."""
    if isinstance(value, str):
        return value
    texts: list[str] = []
    for j, part in enumerate(_list(value, where)):
        if isinstance(part, Mapping) and part.get("type") != "text":
            raise InvalidRequest(f"{where}[{j}].type: only text parts are supported, "
                                 f"got {part.get('type')!r}")
        fields = _as_dict(part, f"{where}[{j}]", _TEXT_PART_KEYS)
        if not isinstance(fields.get("text"), str):
            raise InvalidRequest(f"{where}[{j}].text must be a str")
        texts.append(fields["text"])
    return "".join(texts)


def _tool_calls(value: object, where: str) -> list[Any]:
    calls = []
    for j, call in enumerate(_list(value, where)):
        fields = _as_dict(call, f"{where}[{j}]", _CALL_KEYS, functions_only=True)
        function = _as_dict(fields.get("function"), f"{where}[{j}].function",
                            _CALL_FUNCTION_KEYS)
        if not isinstance(function.get("arguments"), str):
            raise InvalidRequest(f"{where}[{j}].function.arguments must be a str "
                                 "(the arguments as JSON text)")
        calls.append({**fields, "function": function})
    return calls


def _message(item: object, where: str) -> ChatMessage:
    fields = _as_dict(item, where, _MESSAGE_KEYS)
    role = fields.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequest(f"{where}['role'] must be a non-empty str")
    content = fields.get("content")
    if content is None:
        if role != "assistant":
            raise InvalidRequest(f"{where}['content'] must be a str "
                                 "(only an assistant's may be None)")
    else:
        fields["content"] = _content(content, f"{where}.content")
    for key, owner in (("tool_calls", "assistant"), ("reasoning_content", "assistant"),
                       ("tool_call_id", "tool")):
        if fields.get(key) is not None and role != owner:
            raise InvalidRequest(f"{where}.{key}: only an {owner} message carries it, "
                                 f"not a {role!r} one")
    if role == "tool" and not fields.get("tool_call_id"):
        raise InvalidRequest(f"{where}.tool_call_id: a tool message must name the call "
                             "it answers")
    if fields.get("tool_calls") is not None:
        fields["tool_calls"] = _tool_calls(fields["tool_calls"], f"{where}.tool_calls")
    return _convert(fields, ChatMessage, where)


def messages_from(value: object) -> list[ChatMessage]:
    """Validate a conversation; every tool result must answer an earlier tool call."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidRequest("messages must be a list of {'role': ..., 'content': ...} dicts")
    if not value:
        raise InvalidRequest("messages must not be empty")
    out: list[ChatMessage] = []
    called: set[str] = set()
    for i, item in enumerate(value):
        message = _message(item, f"messages[{i}]")
        called.update(call.id for call in message.tool_calls or ())
        if message.tool_call_id is not None and message.tool_call_id not in called:
            raise InvalidRequest(f"messages[{i}].tool_call_id: {message.tool_call_id!r} "
                                 "answers no tool call of an earlier assistant message")
        out.append(message)
    return out


# ---------------------------------------------------------------------------- tools


def tools_from(value: object) -> list[ToolSpec] | None:
    """OpenAI's ``tools`` (function tools only); an empty list is the same as none."""
    if value is None:
        return None
    items = _list(value, "tools")
    if len(items) > MAX_TOOLS:
        raise InvalidRequest(f"tools: at most {MAX_TOOLS} tools, got {len(items)}")
    tools = []
    for i, item in enumerate(items):
        fields = _as_dict(item, f"tools[{i}]", _TOOL_KEYS, functions_only=True)
        fields["function"] = _as_dict(fields.get("function"), f"tools[{i}].function",
                                      _FUNCTION_KEYS)
        tools.append(_convert(fields, ToolSpec, f"tools[{i}]"))
    return tools or None


def tool_choice_from(value: object) -> ToolChoice | None:
    """"auto", "none", "required", or ``{"type": "function", "function": {"name": ...}}``."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in TOOL_CHOICE_WORDS:
            raise InvalidRequest(f"tool_choice: expected one of {', '.join(TOOL_CHOICE_WORDS)} "
                                 f"or a named function, got {value!r}")
        return value  # type: ignore[return-value]  # one of the Literal's words
    fields = _as_dict(value, "tool_choice", _CHOICE_KEYS, functions_only=True)
    fields["function"] = _as_dict(fields.get("function"), "tool_choice.function",
                                  frozenset({"name"}))
    return _convert(fields, NamedToolChoice, "tool_choice")


# ------------------------------------------------------------------------ the rest


def _template_kwargs(value: object) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRequest("chat_template_kwargs must be a dict with str keys")
    try:
        msgspec.json.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"chat_template_kwargs must hold JSON values only: {exc}") from None
    return dict(value)


def _reasoning_effort(value: object) -> ReasoningEffort | None:
    if value is None or value in REASONING_EFFORTS:
        return value  # type: ignore[return-value]  # None or one of the Literal's words
    raise InvalidRequest(f"reasoning_effort: expected one of {', '.join(REASONING_EFFORTS)}, "
                         f"got {value!r}")


def chat_fields_from(options: Mapping[str, Any], *, chat: bool) -> ChatFields:
    """The template keywords of ``options``; with a plain prompt (``chat`` False) giving
    any of them is refused: no template would read it."""
    if not chat:
        given = [name for name in TEMPLATE_KEYWORDS if options.get(name) is not None]
        if given:
            raise InvalidRequest(f"{', '.join(given)} need messages=...: only a chat "
                                 "template reads them")
    parallel = options.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequest(f"parallel_tool_calls must be a bool, got {parallel!r}")
    return ChatFields(
        tools=tools_from(options.get("tools")),
        tool_choice=tool_choice_from(options.get("tool_choice")),
        parallel_tool_calls=parallel,
        chat_template_kwargs=_template_kwargs(options.get("chat_template_kwargs")),
        reasoning_effort=_reasoning_effort(options.get("reasoning_effort")),
    )
