"""Step time as a function of the tokens a step computes, measured as the engine runs.

Whether speculation pays depends on the regime: a batch-1 decode reads every weight for
one token, so scoring four more tokens in the same pass is nearly free; a batch of 48
is already compute-bound, and every draft token costs about what a real one does. A
linear cost model cannot hold both, so the curve is learned per bucket of token count
(decaying averages of the steps that landed there) and read by interpolation between
measured buckets. Where it knows nothing (no bucket above the point asked), the slope
is taken as zero: the policy then speculates, and the curve learns what that cost.
"""

from __future__ import annotations

import bisect
import itertools

# Bucket upper bounds (tokens per step); a step lands in the first bucket that holds it.
BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160,
           192, 256, 320, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)
SMOOTHING = 0.2


class StepTimeCurve:
    """Milliseconds per step against tokens per step, one decaying average per bucket."""

    def __init__(self) -> None:
        self._ms: dict[int, float] = {}
        self._tokens: dict[int, float] = {}

    def observe(self, num_tokens: int, ms: float) -> None:
        if num_tokens <= 0 or not ms >= 0.0 or ms == float("inf"):
            return
        bucket = bisect.bisect_left(BUCKETS, num_tokens)
        if bucket not in self._ms:
            self._ms[bucket] = ms
            self._tokens[bucket] = float(num_tokens)
            return
        self._ms[bucket] += SMOOTHING * (ms - self._ms[bucket])
        self._tokens[bucket] += SMOOTHING * (num_tokens - self._tokens[bucket])

    def _points(self) -> list[tuple[float, float]]:
        """The measured buckets in token order, times made non-decreasing (a bucket
        measured in a quiet moment must not make more tokens look cheaper)."""
        points = sorted((self._tokens[b], self._ms[b]) for b in self._ms)
        highest = 0.0
        for i, (x, y) in enumerate(points):
            highest = max(highest, y)
            points[i] = (x, highest)
        return points

    def predict_ms(self, num_tokens: float) -> float | None:
        """The expected step time at ``num_tokens``; None before any measurement."""
        points = self._points()
        if not points:
            return None
        if num_tokens <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if num_tokens <= x1:
                return y0 + (y1 - y0) * (num_tokens - x0) / max(x1 - x0, 1e-9)
        return points[-1][1]  # unknown beyond: flat (explore; see module docstring)
