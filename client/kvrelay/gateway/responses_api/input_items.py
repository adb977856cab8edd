"""The Responses ``input`` (and ``instructions``) as the chat messages a worker renders.

Message items become messages (``developer`` as ``system``); a ``function_call`` item
joins the assistant message just before it as one of its ``tool_calls`` (or starts one);
a ``function_call_output`` item is a ``tool`` message answering its ``call_id``; a
``reasoning`` item is the ``reasoning_content`` of the next assistant message (dropped
when no assistant message follows: nothing would render it).
"""

from __future__ import annotations

from typing import Any

from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.responses_api.checks import expect_list, expect_object, expect_str
from kvrelay.gateway.responses_api.fields import ITEMS, PARTS, REASONING_PARTS, check_fields
from kvrelay.protocol import ChatMessage, FunctionCall, ToolCall

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def to_messages(value: Any, instructions: str | None) -> list[ChatMessage]:
    """``instructions`` as a system message, then ``input`` (a string: one user message)."""
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage(role="system", content=instructions))
    if isinstance(value, str):
        messages.append(ChatMessage(role="user", content=value))
        return messages
    items = expect_list(value, "input")
    if not items:
        raise bad_request("input: give a string or at least one item", "input")
    _Conversation(messages).add_all(items)
    return messages


class _Conversation:
    """Folds items into messages, in order."""

    def __init__(self, messages: list[ChatMessage]) -> None:
        self.messages = messages
        self.reasoning: str | None = None  # waits for the next assistant message
        self.calls_join_last = False  # the last message is an assistant's, open to calls
        self.names: dict[str, str] = {}  # call id -> function name

    def add_all(self, items: list[Any]) -> None:
        for i, raw in enumerate(items):
            where = f"input[{i}]"
            item = expect_object(raw, where)
            kind = item.get("type", "message")
            rules = ITEMS.get(kind) if isinstance(kind, str) else None
            if rules is None:
                raise bad_request(f"{where}.type: {kind!r} items are not supported (give "
                                  f"{', '.join(ITEMS)})", f"{where}.type")
            check_fields(item, rules, where)
            if kind == "message":
                self._message(item, where)
            elif kind == "function_call":
                self._function_call(item, where)
            elif kind == "function_call_output":
                self._function_call_output(item, where)
            else:
                self._reasoning(item, where)

    def _message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role not in _ROLES:
            raise bad_request(f"{where}.role: expected one of {', '.join(_ROLES)}, "
                              f"got {role!r}", f"{where}.role")
        text = content_text(item.get("content"), f"{where}.content")
        if role == "assistant":
            self.messages.append(ChatMessage(role="assistant", content=text,
                                             reasoning_content=self._take_reasoning()))
            self.calls_join_last = True
        else:
            self.messages.append(ChatMessage(role=_ROLES[role], content=text))
            self.calls_join_last = False

    def _function_call(self, item: dict[str, Any], where: str) -> None:
        call_id = expect_str(item.get("call_id"), f"{where}.call_id")
        name = expect_str(item.get("name"), f"{where}.name")
        arguments = expect_str(item.get("arguments"), f"{where}.arguments")
        if not call_id:
            raise bad_request(f"{where}.call_id: must not be empty", f"{where}.call_id")
        self.names[call_id] = name
        call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))
        last = self.messages[-1] if self.messages else None
        if self.calls_join_last and last is not None and self.reasoning is None:
            last.tool_calls = [*(last.tool_calls or []), call]
            return
        self.messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call],
                                         reasoning_content=self._take_reasoning()))
        self.calls_join_last = True

    def _function_call_output(self, item: dict[str, Any], where: str) -> None:
        call_id = expect_str(item.get("call_id"), f"{where}.call_id")
        name = item.get("name")
        if name is not None:
            name = expect_str(name, f"{where}.name")
        text = content_text(item.get("output"), f"{where}.output")
        self.messages.append(ChatMessage(role="tool", content=text, tool_call_id=call_id,
                                         name=name or self.names.get(call_id)))
        self.calls_join_last = False

    def _reasoning(self, item: dict[str, Any], where: str) -> None:
        content = _reasoning_text(item.get("content"), f"{where}.content")
        summary = _reasoning_text(item.get("summary"), f"{where}.summary")
        text = content or summary
        if text:
            self.reasoning = text if self.reasoning is None else self.reasoning + "\n" + text

    def _take_reasoning(self) -> str | None:
        reasoning, self.reasoning = self.reasoning, None
        return reasoning


def content_text(value: Any, where: str) -> str:
    """A message's (or a tool output's) content as text: a string, or text parts joined."""
    if isinstance(value, str):
        return value
    parts = expect_list(value, where)
    texts: list[str] = []
    for j, raw in enumerate(parts):
        param = f"{where}[{j}]"
        part = expect_object(raw, param)
        kind = part.get("type")
        rules = PARTS.get(kind) if isinstance(kind, str) else None
        if rules is None:
            raise bad_request(f"{param}.type: {kind!r} content is not supported: kvrelay's "
                              f"models read text ({', '.join(PARTS)})", f"{param}.type")
        check_fields(part, rules, param)
        key = "refusal" if kind == "refusal" else "text"
        texts.append(expect_str(part.get(key), f"{param}.{key}"))
    return "".join(texts)


def _reasoning_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    texts: list[str] = []
    for j, raw in enumerate(expect_list(value, where)):
        param = f"{where}[{j}]"
        part = expect_object(raw, param)
        kind = part.get("type")
        rules = REASONING_PARTS.get(kind) if isinstance(kind, str) else None
        if rules is None:
            raise bad_request(f"{param}.type: expected one of {', '.join(REASONING_PARTS)}, "
                              f"got {kind!r}", f"{param}.type")
        check_fields(part, rules, param)
        texts.append(expect_str(part.get("text"), f"{param}.text"))
    return "\n".join(texts)
