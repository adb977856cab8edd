"""The wire types of tool calling and reasoning: a request's function tools and how it
must call them, an assistant's calls sent back, and the call pieces events carry.

Kept apart from ``kvrelay.protocol`` (which re-exports every name here) so the contract
of one feature reads in one place; the same rules hold: fields are only appended, with
defaults. The worker renders tools with the model's chat template, decodes "required"
and named choices under a grammar built from the tools' schemas, and parses the model's
calls and reasoning out of its text, so ``Tokens`` events carry text, reasoning and
tool-call pieces that the log, resume and takeover keep like text.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

# The largest JSON Schema of one tool's parameters (as ``response_format``'s schemas).
MAX_SCHEMA_BYTES: Final = 32 << 10

# Tool calling (OpenAI's function tools): the bounds a worker renders and compiles.
MAX_TOOLS: Final = 128
MAX_TOOL_NAME_CHARS: Final = 64
MAX_TOOL_CALLS_PER_MESSAGE: Final = 64
MAX_TEMPLATE_KWARGS_BYTES: Final = 8 << 10
ToolName = Annotated[str, Meta(min_length=1, max_length=MAX_TOOL_NAME_CHARS,
                                pattern=r"^[A-Za-z0-9_.\-]+$")]
# OpenAI's ``reasoning_effort`` values; the worker passes it to templates that read it.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class FunctionSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A callable function: its name, what it does, and the JSON Schema of its arguments."""

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        size = len(msgspec.json.encode(self.parameters or {}))
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the parameters schema of tool {self.name!r} is {size} bytes, "
                             f"over the {MAX_SCHEMA_BYTES} allowed")


class ToolSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One entry of ``tools`` (only function tools exist)."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionName(msgspec.Struct, kw_only=True):
    name: ToolName


class NamedToolChoice(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"] = "function"
    function: FunctionName


# "auto": the model may call tools; "none": it answers in text; "required": it calls at
# least one tool; a ``NamedToolChoice``: it calls that one.
ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class FunctionCall(msgspec.Struct, kw_only=True):
    """A function the model called: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One tool call (in an assistant message sent back, or in a finished choice)."""

    id: Annotated[str, Meta(min_length=1, max_length=128)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A piece of tool call ``index`` of a choice, as OpenAI streams it: ``id`` and
    ``name`` on its first piece only, ``arguments`` (JSON text) in fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
