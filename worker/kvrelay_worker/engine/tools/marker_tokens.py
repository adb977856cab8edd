"""Special tokens the output parsers must see although the text skips special tokens.

Mistral's ``[TOOL_CALLS]`` and ``[ARGS]`` and Llama 3's ``<|python_tag|>`` are special
tokens: a decode that skips special tokens (the default, so EOS and end-of-turn tokens
never reach the answer) would drop the very marker of a call. The detokenizer keeps the
ids named here and still drops every other special token.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from kvrelay_worker.engine.tools.plan import ToolPlan

_FORMAT_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
}
_REASONING_MARKERS: dict[str, tuple[str, ...]] = {"think": ("<think>", "</think>")}

_special_ids_of: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()


def markers_for(tool_plan: ToolPlan | None, reasoning_parser: str | None) -> tuple[str, ...]:
    """The marker texts the choice's parsers read (none for the forced shapes)."""
    markers: tuple[str, ...] = ()
    if tool_plan is not None and tool_plan.mode == "auto" and tool_plan.format is not None:
        markers += _FORMAT_MARKERS.get(tool_plan.format, ())
    if reasoning_parser is not None:
        markers += _REASONING_MARKERS.get(reasoning_parser, ())
    return markers


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """Every id a decode with ``skip_special_tokens`` leaves out (cached per tokenizer)."""
    try:
        cached = _special_ids_of.get(tokenizer)
    except TypeError:  # not weakly referenceable: compute each time
        cached = None
    if cached is not None:
        return cached
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    found = frozenset(ids)
    try:
        _special_ids_of[tokenizer] = found
    except TypeError:
        pass
    return found


def kept_marker_ids(tokenizer: Any, markers: Iterable[str]) -> frozenset[int]:
    """The ids of those ``markers`` that are single special tokens of ``tokenizer``."""
    special = special_token_ids(tokenizer)
    if not special:
        return frozenset()
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return frozenset()
    kept = set()
    for marker in markers:
        token_id = convert(marker)
        if isinstance(token_id, int) and token_id in special:
            kept.add(token_id)
    return frozenset(kept)
