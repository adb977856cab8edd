"""The engine's logprobs as the wire carries them, each token with its bytes.

``token_bytes`` is what a client needs to rebuild text from tokens exactly (a byte-level
token may be part of a UTF-8 character); it comes from the tokenizer's vocabulary
(``engine/sample/token_bytes.py``), looked up only for events that carry logprobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvrelay.protocol import PromptLogprob, TokenLogprob, TopLogprob
from kvrelay_worker.engine.outputs import SampledLogprob

TokenBytesOf = Callable[[int], bytes]


def _top(lp: SampledLogprob, token_bytes: TokenBytesOf) -> list[TopLogprob]:
    return [TopLogprob(t, v, token_bytes(t)) for t, v in lp.top]


def wire_logprobs(logprobs: Sequence[SampledLogprob],
                  token_bytes: TokenBytesOf) -> list[TokenLogprob]:
    """Sampled tokens' logprobs, with their alternatives."""
    return [TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top=_top(lp, token_bytes),
                         token_bytes=token_bytes(lp.token_id))
            for lp in logprobs]


def wire_prompt_logprobs(entries: Sequence[SampledLogprob | None],
                         token_bytes: TokenBytesOf) -> list[PromptLogprob | None]:
    """Prompt tokens' logprobs (None for the first prompt token)."""
    return [None if lp is None else
            PromptLogprob(token_id=lp.token_id, logprob=lp.logprob, top=_top(lp, token_bytes),
                          token_bytes=token_bytes(lp.token_id))
            for lp in entries]
