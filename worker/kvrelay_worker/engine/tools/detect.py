"""Which tool-call and reasoning syntax a model speaks, read from its chat template.

A chat template that renders tools also shows the model how to call them; the markers
it writes are the format's fingerprint. Detection only looks at the template's text, so
it works for any checkpoint whose tokenizer config ships a template, and an explicit
setting (``KVRELAY_TOOL_PARSER`` / ``KVRELAY_REASONING_PARSER``) overrides it.
"""

from __future__ import annotations

from kvrelay_worker.engine.tools.plan import REASONING_FORMATS, TOOL_FORMATS

# Markers, most specific first: a template may mention several (Mistral templates
# never use ``<tool_call>``; Llama 3.x templates write ``<|python_tag|>`` or ask for a
# JSON object with "parameters" under an ``ipython`` role).
_MISTRAL_MARKERS = ("[TOOL_CALLS]", "[AVAILABLE_TOOLS]")
_HERMES_MARKERS = ("<tool_call>",)
_LLAMA3_MARKERS = ("<|python_tag|>", '"parameters": dictionary of argument name')
_LLAMA3_HEADER = "<|start_header_id|>"


def detect_tool_format(chat_template: str | None) -> str | None:
    """The native tool-call format (one of ``TOOL_FORMATS``) the template teaches, or None."""
    if not chat_template:
        return None
    if any(marker in chat_template for marker in _MISTRAL_MARKERS):
        found = "mistral"
    elif any(marker in chat_template for marker in _HERMES_MARKERS):
        found = "hermes"
    elif any(marker in chat_template for marker in _LLAMA3_MARKERS) or (
        _LLAMA3_HEADER in chat_template and "ipython" in chat_template
    ):
        found = "llama3_json"
    else:
        return None
    assert found in TOOL_FORMATS
    return found


def detect_reasoning_format(chat_template: str | None) -> str | None:
    """``"think"`` when the template writes or strips ``<think>`` blocks, else None."""
    if not chat_template or "<think>" not in chat_template:
        return None
    assert "think" in REASONING_FORMATS
    return "think"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether a rendered prompt ends inside an open ``<think>`` block.

    DeepSeek-R1-style templates end the generation prompt with ``<think>\\n``, so the
    model's first tokens are already reasoning; the reasoning parser must start inside.
    """
    tail = prompt_text.rstrip()
    open_at = tail.rfind("<think>")
    return open_at >= 0 and tail.find("</think>", open_at) < 0
