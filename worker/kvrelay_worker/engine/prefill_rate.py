"""How fast this engine prefills, measured from its own recent steps.

Why: a worker that takes over a dead worker's jobs must prefill each one's prompt and
tokens so far again before its stream moves; how much of that it may take on at once
(``jobs/takeover_throttle.py``) depends on how fast *its* engine prefills on *its*
device, beside the decodes it runs, which only its steps can tell. The rate is the
prompt tokens of the last ``window`` steps that prefilled any, over those steps'
durations: decode rows riding along count as cost, as they do for a stream waiting on
its re-prefill. No steps of that kind yet: 0 (unknown).

Torch-free: the simulated engine keeps one too.
"""

from __future__ import annotations

from collections import deque

# Prefill steps the rate is taken over: enough to smooth one odd step, few enough to
# follow a takeover's burst of long prefills within a few steps.
DEFAULT_WINDOW = 32


class PrefillRate:
    """Prompt tokens per second over the engine's latest prefill steps."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, prefill_tokens: int, seconds: float) -> None:
        """A step computed ``prefill_tokens`` prompt tokens (and maybe decodes) in
        ``seconds``; steps without prompt tokens, or with no usable time, teach nothing."""
        if prefill_tokens > 0 and 0.0 < seconds < float("inf"):
            self._steps.append((prefill_tokens, seconds))

    def tokens_per_s(self) -> float:
        """The measured rate; 0.0 before any prefill step was observed."""
        seconds = sum(s for _, s in self._steps)
        return sum(t for t, _ in self._steps) / seconds if seconds > 0 else 0.0
