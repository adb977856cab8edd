"""What a request asks of tool calling, decided once at intake (``ToolPlan``).

The plan says how a sequence's output becomes tool calls:

- ``none``: plain text, no tools (the template may still render them);
- ``named``: the whole output is the arguments of ``named``, decoded under the grammar
  of that function's parameter schema;
- ``required``: the whole output is a JSON array of ``{"name": ..., "arguments": {...}}``
  (one item when ``parallel`` is false), decoded under a grammar built from every
  tool's schema, so any model returns calls that validate;
- ``auto``: the model may answer or call; ``format`` names its native call syntax
  (``TOOL_FORMATS``; None: the template has none, so the output stays text), parsed as
  it streams and constrained by a trigger-activated grammar once a call opens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from kvrelay.protocol import ToolSpec

# The native tool-call syntaxes the worker parses (``KVRELAY_TOOL_PARSER`` names one).
TOOL_FORMATS: Final = ("hermes", "llama3_json", "mistral")
# The reasoning syntaxes (``KVRELAY_REASONING_PARSER``): ``<think>...</think>``.
REASONING_FORMATS: Final = ("think",)

ToolMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    mode: ToolMode
    tools: tuple[ToolSpec, ...] = field(default_factory=tuple)
    named: str | None = None
    parallel: bool = True
    format: str | None = None
