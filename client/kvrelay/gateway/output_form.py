"""How a request wants its answer written: chat or text, and the choices that change the
response's shape but not the job (usage chunk, token names, the echoed prompt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

CHAT: Final = "chat"
TEXT: Final = "text"


@dataclass(frozen=True, slots=True)
class Echo:
    """Completions' ``echo``: the prompt as it was sent (text, or token ids), before each
    choice's text; with ``logprobs`` the prompt's tokens come first in its logprobs."""

    prompt: str | None
    prompt_token_ids: list[int] | None
    logprobs: bool

    @property
    def needs_prompt_logprobs(self) -> bool:
        """The worker must report the prompt's tokens: for their logprobs, or for their
        text when the prompt came as token ids (the gateway has no tokenizer)."""
        return self.logprobs or self.prompt is None


@dataclass(frozen=True, slots=True)
class OutputForm:
    kind: str
    include_usage: bool = False
    # vLLM's ``return_tokens_as_token_ids``: name logprob tokens ``token_id:<id>``.
    token_ids_as_names: bool = False
    echo: Echo | None = None
