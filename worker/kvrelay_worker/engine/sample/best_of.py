"""best_of: which of a request's candidates it returns, and in what order."""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq


def best_candidates(cumulative_logprobs: Seq[float | None], n: int) -> list[int]:
    """Indexes of the ``n`` candidates with the highest cumulative log-probability, best
    first; ties keep candidate order (so a seeded request picks the same winners every
    time), and an unknown score ranks last."""
    def score(index: int) -> float:
        value = cumulative_logprobs[index]
        return -math.inf if value is None or math.isnan(value) else value

    ranked = sorted(range(len(cumulative_logprobs)), key=lambda i: -score(i))
    return ranked[:n]
