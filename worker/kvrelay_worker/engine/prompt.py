"""The one check of a prompt against a model, shared by the engine and the worker.

The offline ``LLM`` (through ``LLMEngine.add_request``) and the worker's task thread
(which needs the token count before it submits) call the same function, so a prompt is
refused for the same reasons, with the same messages, by both doors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvrelay_worker.engine.errors import InvalidPromptError, PromptTooLongError

Prompt = str | Sequence[int]


def prompt_token_ids(prompt: Prompt, tokenizer: Any, vocab_size: int,
                     max_model_len: int) -> list[int]:
    """Tokens of ``prompt`` (text or token ids) that fit the model with room for output.

    Raises ``InvalidPromptError`` (empty, untokenizable, an id outside the vocabulary) or
    ``PromptTooLongError`` (no room for one output token within ``max_model_len``).
    """
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidPromptError("the prompt is empty")
        try:
            ids = list(tokenizer.encode(prompt))
        except Exception as exc:  # a tokenizer blowing up on odd text
            raise InvalidPromptError(f"could not tokenize the prompt: {exc}") from None
    else:
        ids = list(prompt)
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int):
                raise InvalidPromptError(f"prompt token ids must be integers, got {t!r}")
            if not 0 <= t < vocab_size:
                raise InvalidPromptError(
                    f"token id {t} is outside the vocabulary [0, {vocab_size})"
                )
    if not ids:
        raise InvalidPromptError("the prompt is empty")
    if len(ids) >= max_model_len:
        raise PromptTooLongError(
            f"the prompt has {len(ids)} tokens; max_model_len is {max_model_len}, "
            f"which leaves no room for output"
        )
    return ids
