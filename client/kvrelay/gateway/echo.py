"""Completions' ``echo``: the prompt's text and, with ``logprobs``, its tokens' entries.

The worker reports the prompt's tokens (``prompt_logprobs``) with their bytes, except the
first: nothing precedes it, so its entry is None. A text prompt is echoed as it was sent
and its first token's bytes are what the others' leave of it; a token-id prompt's text is
its tokens' bytes, and its first token, which the gateway cannot spell without a
tokenizer, reads ``token_id:<id>`` and adds no text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvrelay.gateway.logprob_json import TextOffsets, text_logprobs
from kvrelay.gateway.output_form import Echo
from kvrelay.protocol import PromptLogprob


def _prompt_text(echo: Echo,
                 scored: Sequence[PromptLogprob | None]) -> tuple[str, str, bytes | None]:
    """The echoed text, and the first token's name and bytes."""
    rest: bytes | None = b"".join(item.token_bytes or b"" for item in scored[1:]
                                  if item is not None) if scored else None
    if echo.prompt is not None:
        whole = echo.prompt.encode("utf-8", "surrogatepass")
        first = None
        if rest is not None and whole.endswith(rest):
            first = whole[:len(whole) - len(rest)]
        name = "" if first is None else first.decode("utf-8", "replace")
        return echo.prompt, name, first
    first_id = echo.prompt_token_ids[0] if echo.prompt_token_ids else 0
    return (rest or b"").decode("utf-8", "replace"), f"token_id:{first_id}", None


def echo_prefix(echo: Echo, scored: Sequence[PromptLogprob | None] | None,
                offsets: TextOffsets, *, as_ids: bool = False,
                ) -> tuple[str, dict[str, list[Any]] | None]:
    """The text to put before a choice's own, and its logprobs part (None unless asked)."""
    entries = list(scored or ())
    text, first_name, first_bytes = _prompt_text(echo, entries)
    if not echo.logprobs:
        offsets.of([], text)
        return text, None
    if as_ids and echo.prompt_token_ids:
        first_name = f"token_id:{echo.prompt_token_ids[0]}"
    return text, text_logprobs(entries, text, offsets, as_ids=as_ids,
                               first=(first_name, first_bytes))
