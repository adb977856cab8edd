"""The chat template's fields of a chat-completions body (``tools``, ``tool_choice``,
``parallel_tool_calls``, ``chat_template_kwargs``, ``reasoning_effort``) -> SDK keywords.

Validated by ``kvrelay.chat_inputs``, as the SDK validates them, so the gateway accepts
what the SDK accepts; a bad value is a 400 naming the field (and the place inside it).
Other endpoints that take OpenAI's nested tool form reuse ``template_keywords``.
"""

from __future__ import annotations

from typing import Any

from kvrelay.chat_inputs import TEMPLATE_KEYWORDS, chat_fields_from
from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.params import param_of
from kvrelay.protocol import GenerateRequest


def template_keywords(*, tools: Any = None, tool_choice: Any = None,
                      parallel_tool_calls: bool | None = None,
                      chat_template_kwargs: Any = None,
                      reasoning_effort: Any = None) -> dict[str, Any]:
    """The SDK keywords for the fields given (None: not given)."""
    given = {name: value for name, value in (
        ("tools", tools), ("tool_choice", tool_choice),
        ("parallel_tool_calls", parallel_tool_calls),
        ("chat_template_kwargs", chat_template_kwargs),
        ("reasoning_effort", reasoning_effort)) if value is not None}
    try:
        fields = chat_fields_from(given, chat=True)
        # The rules across fields (a named choice among the tools, ...) are the wire's own.
        GenerateRequest(job_id="-", model="-", tools=fields.tools,
                        tool_choice=fields.tool_choice,
                        chat_template_kwargs=fields.chat_template_kwargs)
    except ValueError as exc:  # InvalidRequest is one too
        message = str(exc)
        field = next((n for n in (*TEMPLATE_KEYWORDS, "parallel_tool_calls")
                      if message.startswith(n)), "tools")
        raise bad_request(message, param_of(message, field)) from None
    keywords: dict[str, Any] = {"tools": fields.tools, "tool_choice": fields.tool_choice,
                                "chat_template_kwargs": fields.chat_template_kwargs,
                                "reasoning_effort": fields.reasoning_effort}
    if not fields.parallel_tool_calls:
        keywords["parallel_tool_calls"] = False
    return {k: v for k, v in keywords.items() if v is not None}
