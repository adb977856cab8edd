"""Batches of rows over stacked LoRA adapters, and the per-row float64 oracle.

Shared by the reference tests (``test_lora_apply.py``) and the Triton ones
(``test_triton_lora.py``): the same ragged layouts, built the same way, on any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LoraBatch:
    """One ``lora_apply`` call's arguments."""

    y: torch.Tensor
    x: torch.Tensor
    lora_a: torch.Tensor
    lora_b: torch.Tensor
    row_slots: torch.Tensor

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                            torch.Tensor]:
        """The arguments, ``y`` cloned (the call adds to it in place)."""
        return self.y.clone(), self.x, self.lora_a, self.lora_b, self.row_slots


def ragged_slots(rows: int, slots: int, generator: torch.Generator) -> torch.Tensor:
    """``rows`` slots in random order: slot 0 gets no row, slot 1 one row, slot 2 about
    half of the rest, the others and -1 (no adapter) share what remains at random."""
    assert slots >= 4
    if rows == 1:
        return torch.tensor([2])
    picks = [1]
    rest = rows - 1
    many = rest // 2
    picks += [2] * many
    others = torch.tensor([-1, *range(3, slots)])
    choice = torch.randint(0, len(others), (rest - many,), generator=generator)
    picks += others[choice].tolist()
    perm = torch.randperm(rows, generator=generator)
    return torch.tensor(picks)[perm]


def make_batch(rows: int, in_features: int, out_features: int, slots: int, rank: int,
               dtype: torch.dtype, device: str | torch.device = "cpu",
               lora_dtype: torch.dtype | None = None, seed: int = 0) -> LoraBatch:
    """Random activations, base outputs and adapters whose LoRA term is about the size of
    ``y`` (A scaled by 1/sqrt(in), B by 1/sqrt(rank)), on ragged slots."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    y = torch.randn(rows, out_features, generator=gen)
    a = torch.randn(slots, rank, in_features, generator=gen) / in_features**0.5
    b = torch.randn(slots, out_features, rank, generator=gen) / rank**0.5
    ld = lora_dtype or dtype
    return LoraBatch(y.to(device, dtype), x.to(device, dtype), a.to(device, ld),
                     b.to(device, ld), ragged_slots(rows, slots, gen).to(device))


def per_row_oracle(batch: LoraBatch) -> torch.Tensor:
    """float64 ``y`` with each row's LoRA term added by a plain loop over rows."""
    out = batch.y.double().cpu().clone()
    x, a, b = (t.double().cpu() for t in (batch.x, batch.lora_a, batch.lora_b))
    for t, slot in enumerate(batch.row_slots.tolist()):
        if slot >= 0:
            out[t] += (x[t] @ a[slot].T) @ b[slot].T
    return out
