"""Reference batched LoRA: one pair of matmuls per adapter present in the batch.

The CPU engine's path and the oracle of the Triton kernels. Rows are grouped by slot with
one sort (no per-row Python loop); each adapter's rows are gathered with ``index_select``,
multiplied in float32 through ``A`` then ``B``, and written back with one rounding to
``y``'s dtype (``y + delta`` summed in float32, so a bfloat16 ``y`` is not rounded twice).
"""

from __future__ import annotations

import torch


def _add_rows(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
              rows: torch.Tensor | None) -> None:
    """``y[rows] += (x[rows] @ a.T) @ b.T`` in float32; ``rows=None``: every row."""
    xs = x if rows is None else x.index_select(0, rows)
    delta = (xs.float() @ a.float().T) @ b.float().T
    if rows is None:
        if y.dtype == torch.float32:
            y.add_(delta)
        else:
            y.copy_(y.float() + delta)
        return
    y.index_copy_(0, rows, (y.index_select(0, rows).float() + delta).to(y.dtype))


def lora_apply_reference(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor,
                         lora_b: torch.Tensor, row_slots: torch.Tensor) -> torch.Tensor:
    """``y[t] += (x[t] @ lora_a[s].T) @ lora_b[s].T`` for every row ``t`` of slot ``s >= 0``;
    rows of slot -1 (or, left unchecked, out of range) are left unchanged. In place;
    returns ``y`` (arguments checked by the caller)."""
    total = x.shape[0]
    if total == 0:
        return y
    sorted_slots, order = torch.sort(row_slots.long(), stable=True)
    present, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
    start = 0
    for slot, count in zip(present.tolist(), counts.tolist(), strict=True):
        if 0 <= slot < lora_a.shape[0]:  # as the kernels: an unchecked bad slot is skipped
            rows = None if count == total else order[start:start + count]
            _add_rows(y, x, lora_a[slot], lora_b[slot], rows)
        start += count
    return y
