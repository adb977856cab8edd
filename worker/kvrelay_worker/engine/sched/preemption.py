"""How a preempted sequence gives its KV blocks back: recompute it later, or swap it out.

Recompute frees the blocks and prefills the sequence again when it resumes (what the
prefix cache still holds is not recomputed). Swap copies the live blocks to a host pool
and back, keeping every computed token. ``"auto"`` picks, per victim, whichever a simple
cost model says is cheaper:

- recompute: ``tokens to recompute / prefill tokens per second``, where the prefill rate
  is a compute-bound estimate, ``usable FLOP/s / (2 * parameters)``;
- swap: ``2 * live blocks * bytes per block / copy bandwidth`` (out, then back).

The FLOP/s and bandwidth figures are constants, not measurements: rough sustained values
for a data-centre GPU over PCIe and for a few CPU cores, good to within a small factor,
which is all a choice between two options several times apart needs. Attention's
quadratic share of a long prefill is left out, which only understates recompute. With the
host pool full, a victim is recomputed whatever the mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrelay_worker.engine.options import PREEMPTION_MODES, PreemptionMode

# Sustained dense matmul throughput a prefill reaches, FLOP/s (bf16 tensor cores on a
# recent GPU; float32 on a few CPU cores).
_PREFILL_FLOPS = {"cuda": 200e12, "cpu": 100e9}
# Host <-> device copy bandwidth, bytes/s (pinned memory over PCIe; memcpy on the CPU).
_COPY_BYTES_PER_S = {"cuda": 20e9, "cpu": 5e9}


def preemption_mode(value: str) -> PreemptionMode:
    if value not in PREEMPTION_MODES:
        raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, "
                         f"got {value!r}")
    return value


@dataclass(frozen=True)
class SwapCostModel:
    """Seconds to recompute some tokens versus seconds to swap some blocks out and back."""

    bytes_per_block: int
    prefill_tokens_per_s: float
    copy_bytes_per_s: float

    @classmethod
    def estimate(cls, num_params: int, bytes_per_block: int,
                 device: torch.device) -> SwapCostModel:
        kind = "cuda" if device.type == "cuda" else "cpu"
        return cls(bytes_per_block=bytes_per_block,
                   prefill_tokens_per_s=_PREFILL_FLOPS[kind] / (2 * max(num_params, 1)),
                   copy_bytes_per_s=_COPY_BYTES_PER_S[kind])

    def recompute_seconds(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s

    def swap_seconds(self, num_blocks: int) -> float:
        return 2 * num_blocks * self.bytes_per_block / self.copy_bytes_per_s

    def prefers_swap(self, recompute_tokens: int, swap_blocks: int) -> bool:
        return self.swap_seconds(swap_blocks) < self.recompute_seconds(recompute_tokens)


@dataclass(frozen=True)
class PreemptionPolicy:
    """The configured mode and, for ``"auto"``, the cost model that decides."""

    mode: PreemptionMode = "recompute"
    cost: SwapCostModel | None = None

    def __post_init__(self) -> None:
        if self.mode == "auto" and self.cost is None:
            raise ValueError("preemption_mode 'auto' needs a cost model")

    def wants_swap(self, recompute_tokens: int, swap_blocks: int) -> bool:
        """Whether to swap (host room permitting) rather than recompute."""
        if self.mode == "auto":
            assert self.cost is not None
            return self.cost.prefers_swap(recompute_tokens, swap_blocks)
        return self.mode == "swap"
