"""A request's tools, tool choice and reasoning, turned into what the engine decodes by.

The worker decides once, from the model's chat template and its settings, which call
syntax and which reasoning syntax the model writes (``engine/tools/model_parsers.py``);
each request then gets its ``ToolPlan`` (how its calls are constrained and parsed) and
the reasoning parser. A request whose options cannot all hold is refused here, naming
them.
"""

from __future__ import annotations

from kvrelay.protocol import ErrorCode, GenerateRequest, NamedToolChoice, TextFormat
from kvrelay_worker.engine.tools.model_parsers import ModelParsers
from kvrelay_worker.engine.tools.plan import ToolMode, ToolPlan


class ToolRequestError(ValueError):
    """Request options that cannot all hold; ``code`` goes on the wire."""

    code = ErrorCode.INVALID_REQUEST


def tool_plan_for(request: GenerateRequest, tool_format: str | None) -> ToolPlan | None:
    """The request's plan (None without tools: "auto" or "none" then both mean text;
    "required" and a named choice need tools, which the wire checks); ``tool_choice``
    None is "auto" with tools and "none" without, as OpenAI's."""
    tools = tuple(request.tools or ())
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        return ToolPlan(mode="named", tools=tools, named=choice.function.name,
                        parallel=request.parallel_tool_calls, format=tool_format)
    if not tools:
        return None
    mode: ToolMode = choice if choice is not None else "auto"
    return ToolPlan(mode=mode, tools=tools, parallel=request.parallel_tool_calls,
                    format=tool_format)


def check_tool_request(request: GenerateRequest) -> None:
    """Refuse options that cannot both hold (``ToolRequestError`` names them)."""
    choice = request.tool_choice
    forced = ("a named tool_choice" if isinstance(choice, NamedToolChoice)
              else "tool_choice 'required'" if choice == "required" else None)
    fmt = request.sampling.response_format
    if forced is not None and fmt is not None and not isinstance(fmt, TextFormat):
        kind = type(fmt).__struct_config__.tag
        raise ToolRequestError(f"response_format {kind!r} and {forced} cannot "
                               "both hold: the whole output is the tool calls; drop one")
    if request.messages is None:
        given = [name for name, value in (("chat_template_kwargs", request.chat_template_kwargs),
                                          ("reasoning_effort", request.reasoning_effort))
                 if value is not None]
        if given:
            raise ToolRequestError(f"{' and '.join(given)} need messages: they are chat "
                                   "template variables, and a plain prompt has no template")


def plan_and_reasoning(request: GenerateRequest,
                       parsers: ModelParsers) -> tuple[ToolPlan | None, str | None]:
    """The request's tool plan and reasoning parser, after ``check_tool_request``."""
    check_tool_request(request)
    return tool_plan_for(request, parsers.tool_format), parsers.reasoning_format
