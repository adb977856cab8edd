"""The grammar a ``ToolPlan`` decodes under: exact call text the parsers can rely on.

Every call's arguments are JSON under the tool's ``parameters`` schema (an object of any
members when a tool has none; a schema that does not describe an object is refused),
written compactly: no whitespace but the single space after each ``,`` and ``:``
separating members and items (``json.dumps``'s default), keys in the schema's order.
Each tool's schema is compiled on its own, so its ``$ref``\\s resolve within it.

- ``named``: the output is the named tool's arguments object, nothing else.
- ``required``: the output is one JSON array of calls, nothing else::

      [{"name": "<tool>", "arguments": {...}}, {"name": "<tool>", "arguments": {...}}]

  ``"name"`` then ``"arguments"``, both present, no other key; the name is one of the
  tools and the arguments follow that tool's schema; at least one item, and exactly one
  when ``parallel`` is false. Items are separated by ``", "``. This is the text the
  ``required`` parser reads (and what ``chat_messages`` writes back for templates that
  cannot render calls).
- ``auto`` with a native ``format``: text is free until the model writes the format's
  opening marker; from there the call must name a tool and give its arguments, then the
  text is free again (with ``parallel`` false the output must end after the first call):

  - ``hermes``: ``<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>``
    (as Qwen's and Hermes' templates show it);
  - ``llama3_json``: ``{"name": "<tool>", "parameters": {...}}``;
  - ``mistral``: ``[TOOL_CALLS]`` then the ``required`` array (Mistral v0.3), or
    ``[TOOL_CALLS]<tool>[ARGS]{...}`` per call (tokenizer v11 on), whichever the model
    starts.

  xgrammar's triggered structural tags do this. With a ``response_format`` as well, the
  output is either the answer in that format or only calls (with the whitespace a
  format's calls are separated by), never a mix.
- ``auto`` with no native format and ``none``: no grammar (the response_format's, if any).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvrelay.protocol import ToolSpec
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.tools.plan import ToolPlan

ITEM_SEPARATOR = ", "
_SEPARATORS = (", ", ": ")
# A tool with no parameters schema takes any object.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# auto: (trigger, text before the name, between the name and the arguments, after them)
_NATIVE_CALLS: dict[str, tuple[str, str, str, str]] = {
    "hermes": ("<tool_call>", '<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>"),
    "llama3_json": ('{"name": ', '{"name": "', '", "parameters": ', "}"),
}
_MISTRAL_MARKER = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
# Between calls when the whole output is calls (auto with a response_format).
_CALL_GAP = {"hermes": "\n", "llama3_json": "; "}


def constrains(plan: ToolPlan) -> bool:
    """Whether the plan decodes under a grammar of its own."""
    if not plan.tools:
        return False
    return plan.mode in ("named", "required") or (plan.mode == "auto" and plan.format is not None)


def tool_grammar_key(plan: ToolPlan, format_key: str | None) -> str:
    """The compiled-grammar cache key: the mode, the choices, every tool's schema and the
    response_format's own key."""
    tools = [[t.function.name, t.function.parameters] for t in plan.tools]
    return "tools:" + json.dumps([plan.mode, plan.named, plan.parallel, plan.format, tools,
                                  format_key], sort_keys=True)


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The tool's parameters schema, checked to describe a JSON object."""
    schema = tool.function.parameters
    if not schema:
        return dict(_ANY_OBJECT)
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise SamplingParamsError(f"the parameters of tool {tool.function.name!r} must "
                                  f"describe a JSON object, not {kind!r}")
    return schema


def compile_tool_grammar(compiler: Any, plan: ToolPlan,
                         response_format_part: dict[str, Any] | None = None) -> Any:
    """The plan's compiled grammar (``constrains(plan)`` must hold); with
    ``response_format_part`` (a structural-tag format), the answer's alternative."""
    try:
        if plan.mode == "named":
            tool = _tool(plan.tools, plan.named)
            return compiler.compile_json_schema(json.dumps(arguments_schema(tool)),
                                                any_whitespace=False, separators=_SEPARATORS)
        if plan.mode == "required":
            return compiler.compile_structural_tag(_structural(_call_array(plan)))
        calls = _native_calls(plan, only_calls=response_format_part is not None)
        if response_format_part is not None:
            calls = {"type": "or", "elements": [response_format_part, calls]}
        return compiler.compile_structural_tag(_structural(calls))
    except SamplingParamsError:
        raise
    except Exception as exc:
        raise SamplingParamsError(
            f"the tools' parameter schemas cannot be compiled: "
            f"{str(exc).strip() or type(exc).__name__}") from None


def _tool(tools: Sequence[ToolSpec], name: str | None) -> ToolSpec:
    for tool in tools:
        if tool.function.name == name:
            return tool
    raise SamplingParamsError(f"tool_choice names {name!r}, which is not one of tools")


def arguments_grammar(tool: ToolSpec) -> dict[str, Any]:
    """A structural-tag format for the tool's arguments: its schema's compact grammar."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(json.dumps(arguments_schema(tool)),
                                           any_whitespace=False, separators=_SEPARATORS)
    return {"type": "grammar", "grammar": str(grammar)}


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _one_of(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _structural(fmt: dict[str, Any]) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt})


def _call_array(plan: ToolPlan) -> dict[str, Any]:
    """``[{"name": ..., "arguments": ...}, ...]``: one item, or one or more."""
    one = _one_of([
        {"type": "sequence", "elements": [
            _const(f'{{"name": "{tool.function.name}", "arguments": '),
            arguments_grammar(tool), _const("}")]}
        for tool in plan.tools])
    elements = [_const("["), one]
    if plan.parallel:
        elements.append({"type": "star", "content": {
            "type": "sequence", "elements": [_const(ITEM_SEPARATOR), one]}})
    elements.append(_const("]"))
    return {"type": "sequence", "elements": elements}


def _mistral_calls(plan: ToolPlan) -> dict[str, Any]:
    """After ``[TOOL_CALLS]``: v0.3's array of calls, or tokenizer v11's ``name[ARGS]{...}``
    (one call per marker), whichever the model starts."""
    named_args = [{"type": "sequence", "elements": [
        _const(f"{tool.function.name}{_MISTRAL_ARGS}"), arguments_grammar(tool)]}
        for tool in plan.tools]
    return {"type": "or", "elements": [_call_array(plan), *named_args]}


def _native_calls(plan: ToolPlan, only_calls: bool) -> dict[str, Any]:
    """Free text with the format's calls constrained once opened (``only_calls``: the
    calls alone, back to back)."""
    if plan.format == "mistral":
        after_marker = _mistral_calls(plan)
        if only_calls:
            one = {"type": "sequence", "elements": [_const(_MISTRAL_MARKER), after_marker]}
            return one if not plan.parallel else {
                "type": "sequence", "elements": [one, {"type": "star", "content": one}]}
        return {"type": "dispatch", "rules": [[_MISTRAL_MARKER, after_marker]],
                "loop": plan.parallel}
    if plan.format not in _NATIVE_CALLS:
        raise SamplingParamsError(f"no grammar for tool-call format {plan.format!r}")
    trigger, before, between, after = _NATIVE_CALLS[plan.format]
    tags = [{"type": "tag", "begin": f"{before}{tool.function.name}{between}",
             "content": arguments_grammar(tool), "end": after} for tool in plan.tools]
    if not only_calls:
        return {"type": "triggered_tags", "triggers": [trigger], "tags": tags,
                "at_least_one": False, "stop_after_first": not plan.parallel}
    one = _one_of(tags)
    if not plan.parallel:
        return one
    return {"type": "sequence", "elements": [
        one, {"type": "star", "content": {"type": "sequence",
                                          "elements": [_const(_CALL_GAP[plan.format]), one]}}]}
