"""Responses ``tools`` (the flat function form) and ``tool_choice`` as the wire's tools.

The Responses API writes a function tool flat (``{"type": "function", "name": ...}``)
where chat completions nest it under ``function``; both become one ``ToolSpec``.
``allowed_tools`` shows the model only the functions it lists.
"""

from __future__ import annotations

from typing import Any

from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.responses_api.checks import convert, expect_list, expect_object, expect_str
from kvrelay.gateway.responses_api.fields import (
    FUNCTION_TOOL,
    TOOL_CHOICE_ALLOWED,
    TOOL_CHOICE_FUNCTION,
    check_fields,
)
from kvrelay.protocol import FunctionName, FunctionSpec, NamedToolChoice, ToolChoice, ToolSpec

_MODES = ("auto", "none", "required")


def to_tools(value: Any) -> list[ToolSpec]:
    """Function tools; any other tool type is a 400 naming it."""
    tools: list[ToolSpec] = []
    for i, raw in enumerate(expect_list(value, "tools")):
        where = f"tools[{i}]"
        tool = expect_object(raw, where)
        kind = tool.get("type")
        if kind != "function":
            raise bad_request(f"{where}.type: {kind!r} tools are not supported: kvrelay "
                              "serves function tools only", f"{where}.type")
        check_fields(tool, FUNCTION_TOOL, where)
        spec = {k: tool[k] for k in ("name", "description", "parameters", "strict")
                if tool.get(k) is not None}
        tools.append(ToolSpec(function=convert(spec, FunctionSpec, where)))
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_request(f"tools[{i}].name: {name!r} is the name of an earlier tool",
                              f"tools[{i}].name")
    return tools


def to_tool_choice(value: Any, tools: list[ToolSpec]) -> tuple[ToolChoice, list[ToolSpec]]:
    """The wire's tool choice, and the tools the model is shown (all, or the allowed)."""
    if isinstance(value, str):
        if value not in _MODES:
            raise bad_request(f"tool_choice: expected one of {', '.join(_MODES)} or an object, "
                              f"got {value!r}", "tool_choice")
        if value == "required" and not tools:
            raise bad_request("tool_choice: 'required' needs tools", "tool_choice")
        return value, tools  # type: ignore[return-value]  # one of _MODES
    choice = expect_object(value, "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        check_fields(choice, TOOL_CHOICE_FUNCTION, "tool_choice")
        name = _known_name(choice.get("name"), tools, "tool_choice.name")
        return NamedToolChoice(function=FunctionName(name=name)), tools
    if kind == "allowed_tools":
        check_fields(choice, TOOL_CHOICE_ALLOWED, "tool_choice")
        mode = choice.get("mode")
        if mode not in ("auto", "required"):
            raise bad_request(f"tool_choice.mode: expected auto or required, got {mode!r}",
                              "tool_choice.mode")
        allowed: list[str] = []
        for i, raw in enumerate(expect_list(choice.get("tools"), "tool_choice.tools")):
            where = f"tool_choice.tools[{i}]"
            entry = expect_object(raw, where)
            if entry.get("type") != "function":
                raise bad_request(f"{where}.type: only function tools can be allowed, got "
                                  f"{entry.get('type')!r}", f"{where}.type")
            check_fields(entry, TOOL_CHOICE_FUNCTION, where)
            allowed.append(_known_name(entry.get("name"), tools, f"{where}.name"))
        shown = [t for t in tools if t.function.name in allowed]
        if not shown:
            raise bad_request("tool_choice.tools: allow at least one function",
                              "tool_choice.tools")
        return mode, shown
    raise bad_request(f"tool_choice.type: {kind!r} is not supported: choose 'function' or "
                      "'allowed_tools' (kvrelay serves function tools only)", "tool_choice.type")


def _known_name(value: Any, tools: list[ToolSpec], param: str) -> str:
    name = expect_str(value, param)
    if not any(t.function.name == name for t in tools):
        raise bad_request(f"{param}: {name!r} is not one of tools", param)
    return name
