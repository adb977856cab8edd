"""How long a simulated engine step takes: a fixed cost plus a cost per batched token.

A decode step of a memory-bound GPU costs roughly the time to read the weights once
(the fixed part) plus a little per sequence (its KV reads and its share of the compute);
a prompt chunk costs per token. One linear model covers both well enough for a load
generator; the defaults (KVRELAY_SIMULATED_STEP_MS / _TOKEN_MS) make a 64-sequence decode
step last about as long as a data-centre GPU's decoding an 8B model in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepTimeModel:
    step_ms: float = 20.0
    token_ms: float = 0.08

    def __post_init__(self) -> None:
        if self.step_ms < 0 or self.token_ms < 0:
            raise ValueError(f"step times must be >= 0, got {self.step_ms} ms + "
                             f"{self.token_ms} ms per token")

    def seconds(self, batched_tokens: int) -> float:
        """The duration of a step that runs ``batched_tokens`` tokens."""
        return (self.step_ms + self.token_ms * batched_tokens) / 1000.0
