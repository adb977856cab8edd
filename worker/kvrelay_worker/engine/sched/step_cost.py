"""An online model of how long an engine step takes, fitted from the steps it has run.

Why: with a fixed token budget a long prompt's chunk stalls every decoding stream for as
long as that chunk takes. To size prompt chunks against a latency target instead, the
scheduler must predict a step's time before running it; that time depends on the model,
the device, the thread settings and whatever else shares the machine, so it is measured,
not configured. The model is linear in a step's shape (``StepShape``)::

    ms ≈ a + b·decode_rows + c·decode_kv_tokens/1000 + d·prefill_tokens
           + e·prefill_attention_pairs/1e6

(a: fixed overhead; b: a decode row's weights and sampling; c: reading its KV;
d: a prompt token's matmuls; e: prompt attention, quadratic in the chunk's context).
It is fitted by weighted least squares over the most recent steps, each weighted by
``forgetting**age`` so the fit follows a machine whose speed changes, with a small ridge
so unseen features stay at zero, reweighting passes that first shrink, then drop, the
outliers (a pause elsewhere on the machine), and coefficients kept at or above zero.

Until a prompt token has been measured the model knows nothing of prefill cost (its
coefficients stay at zero); ``prefill_pacing.py`` copes with that cold start by never
asking it about a chunk much larger than the largest it has measured
(``largest_prefill``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# Feature units: keep the columns within a few orders of magnitude of each other.
_KV_UNIT = 1000.0
_PAIR_UNIT = 1e6


@dataclass(frozen=True)
class StepShape:
    """What a step computes, in the terms its cost depends on."""

    decode_rows: int = 0  # rows of one new token
    decode_kv_tokens: int = 0  # the context those rows attend to, summed
    prefill_tokens: int = 0  # tokens of rows with more than one new token
    prefill_attention_pairs: int = 0  # (query, key) pairs those tokens attend over

    def features(self) -> list[float]:
        return [1.0, float(self.decode_rows), self.decode_kv_tokens / _KV_UNIT,
                float(self.prefill_tokens), self.prefill_attention_pairs / _PAIR_UNIT]

    def plus_prefill(self, context: int, num_tokens: int) -> StepShape:
        """This shape with a prompt chunk of ``num_tokens`` after ``context`` computed ones."""
        return StepShape(self.decode_rows, self.decode_kv_tokens,
                         self.prefill_tokens + num_tokens,
                         self.prefill_attention_pairs + attention_pairs(context, num_tokens))

    def plus_decode(self, context: int) -> StepShape:
        """This shape with one more decode row after ``context`` computed tokens."""
        return StepShape(self.decode_rows + 1, self.decode_kv_tokens + context + 1,
                         self.prefill_tokens, self.prefill_attention_pairs)

    @classmethod
    def of(cls, rows: Iterable[tuple[int, int] | tuple[int, int, int]]) -> StepShape:
        """The shape of a step of (computed tokens, new tokens[, draft tokens]) rows.

        A decode row verifying drafts (speculative decoding) is a decode row plus its
        drafts as prompt tokens after the row's context: what it computes.
        """
        shape = cls()
        for row in rows:
            context, num_new = row[0], row[1]
            drafts = row[2] if len(row) == 3 else 0
            if num_new - drafts == 1:
                shape = shape.plus_decode(context)
                if drafts:
                    shape = shape.plus_prefill(context + 1, drafts)
            else:
                shape = shape.plus_prefill(context, num_new)
        return shape


def attention_pairs(context: int, num_tokens: int) -> int:
    """Causal (query, key) pairs of ``num_tokens`` queries after ``context`` cached keys."""
    return num_tokens * context + num_tokens * (num_tokens + 1) // 2


class StepCostModel:
    """Predicts a step's milliseconds from its shape; learns from ``observe``."""

    def __init__(self, *, window: int = 128, forgetting: float = 0.97,
                 ridge: float = 1e-6, outlier_scale: float = 3.0) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        self._samples: deque[tuple[list[float], float]] = deque(maxlen=window)
        self.forgetting = forgetting
        self.ridge = ridge
        self.outlier_scale = outlier_scale
        self._coef: np.ndarray | None = None
        self.largest_prefill = 0  # the largest prompt-token count of a measured step

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def observe(self, shape: StepShape, ms: float) -> None:
        if not ms >= 0.0 or ms == float("inf"):
            return  # a broken clock reading teaches nothing
        self._samples.append((shape.features(), ms))
        self.largest_prefill = max(self.largest_prefill, shape.prefill_tokens)
        self._coef = None

    @property
    def coefficients(self) -> np.ndarray:
        """(a, b, c, d, e) in the module docstring's order; zeros before any sample."""
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def predict_ms(self, shape: StepShape) -> float:
        return float(np.dot(self.coefficients, shape.features()))

    def _fit(self) -> np.ndarray:
        if not self._samples:
            return np.zeros(5)
        x = np.array([f for f, _ in self._samples])
        y = np.array([ms for _, ms in self._samples])
        ages = np.arange(len(y) - 1, -1, -1, dtype=float)
        weights = self.forgetting ** ages
        scale = np.sqrt((x * x).mean(axis=0))
        scale[scale == 0.0] = 1.0
        xs = x / scale
        coef = self._solve(xs, y, weights)
        for attempt in range(4):
            # Residuals beyond a few robust spreads are outliers: first down-weighted
            # (Huber), then, once the fit is near, dropped.
            residual = np.abs(xs @ coef - y)
            limit = self.outlier_scale * (1.4826 * float(np.median(residual)) + 1e-9)
            if attempt < 2:
                robust = np.minimum(1.0, limit / np.maximum(residual, 1e-12))
            else:
                robust = (residual <= limit).astype(float)
            coef = self._solve(xs, y, weights * robust)
        return coef / scale

    def _solve(self, xs: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Weighted ridge least squares, then refit without any negative coefficient."""
        active = np.ones(xs.shape[1], dtype=bool)
        coef = np.zeros(xs.shape[1])
        for _ in range(xs.shape[1]):
            a = xs[:, active]
            gram = (a.T * w) @ a + self.ridge * w.sum() * np.eye(int(active.sum()))
            sol = np.linalg.solve(gram, (a.T * w) @ y)
            if (sol >= 0).all():
                coef[:] = 0.0
                coef[active] = sol
                return coef
            idx = np.flatnonzero(active)
            active[idx[sol < 0]] = False
            if not active.any():
                break
        return coef
