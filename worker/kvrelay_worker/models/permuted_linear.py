"""A linear layer whose stored input columns are in another order than its inputs.

GPTQ with activation order (``desc_act``) quantizes a layer's inputs in a chosen order and
records each input's group (``g_idx``), so a group's inputs lie scattered along the row.
Sorting the columns by group makes the groups contiguous, as the quantized layout needs;
the activations are then gathered in the same order, once per layer input (q/k/v share
one gather, gate/up another), before the product: ``y = x[..., perm] @ W[:, perm].T``.
"""

from __future__ import annotations

import torch
from torch import nn


class InputPermutedLinear(nn.Module):
    """``inner(x[..., perm])``: ``inner`` holds the weight with its columns in ``perm`` order."""

    perm: torch.Tensor

    def __init__(self, inner: nn.Module, perm: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("perm", perm.to(torch.long))
        self.in_features = int(perm.numel())
        self.out_features = int(getattr(inner, "out_features", 0))

    @property
    def bias(self) -> nn.Parameter | None:
        return getattr(self.inner, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.index_select(-1, self.perm))
