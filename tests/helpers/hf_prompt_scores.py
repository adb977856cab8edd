"""Transformers as the oracle for prompt log-probabilities (``echo`` / ``prompt_logprobs``).

The reference is the float32 model's ``log_softmax`` over its raw logits at every prompt
position; the engine's entries (``SampledLogprob``) and the wire's (``PromptLogprob``,
OpenAI's ``token_logprobs``) are checked against it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

TOLERANCE = 1e-4


@torch.no_grad()
def hf_log_softmax(model: PreTrainedModel, ids: Sequence[int]) -> torch.Tensor:
    """``[len(ids), vocab]``: row ``p`` is the distribution of the token after position p."""
    logits = model(torch.tensor([list(ids)], dtype=torch.long)).logits[0]
    return logits.float().log_softmax(dim=-1)


def _pairs(top: Sequence[Any]) -> list[tuple[int, float]]:
    """(token id, logprob) of each alternative, engine tuples or wire ``TopLogprob``s."""
    return [(t.token_id, t.logprob) if hasattr(t, "token_id") else (t[0], t[1]) for t in top]


def assert_top_matches(top: Sequence[Any], row: torch.Tensor, k: int) -> None:
    """``top`` holds ``k`` alternatives, best first, each with its reference value, and they
    are the ``k`` most likely tokens (ties within the tolerance may come in either order)."""
    pairs = _pairs(top)
    assert len(pairs) == k
    kth_best = float(row.topk(k).values[-1]) if k else 0.0
    for token, value in pairs:
        assert abs(value - float(row[token])) <= TOLERANCE, (token, value, float(row[token]))
        assert value >= kth_best - TOLERANCE
    values = [v for _, v in pairs]
    assert values == sorted(values, reverse=True)
    assert len({t for t, _ in pairs}) == k


def assert_prompt_logprobs_match(entries: Sequence[Any], ids: Sequence[int],
                                 reference: torch.Tensor, k: int) -> None:
    """One entry per prompt token, None first, each equal to the reference within 1e-4."""
    assert len(entries) == len(ids)
    assert entries[0] is None
    for i in range(1, len(ids)):
        entry, row = entries[i], reference[i - 1]
        assert entry is not None, f"no entry for prompt token {i}"
        assert entry.token_id == ids[i]
        assert abs(entry.logprob - float(row[ids[i]])) <= TOLERANCE, (
            i, entry.logprob, float(row[ids[i]]))
        assert_top_matches(entry.top, row, k)
