"""Linear layers whose few-row products on CPU use both cores.

A decode step multiplies a handful of rows (one per sequence, a few more when it verifies
speculative drafts) by every weight matrix. On CPU, ``F.linear`` sends such products to a
matrix-vector routine that streams the weights on one core. The same product written
as ``W @ x.T`` (a matrix times a few columns) is split across the cores, so a one-row
step is computed with that row duplicated into two columns; the speed-up (and the cost of
the extra column) is measured by ``benchmarks/cpu_decode_gflops.py``.
Float32 only (what was measured); other devices, dtypes and larger batches keep
``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Up to this many rows the product runs as W @ x.T (decode and verification batches;
# larger ones were not measured in the model and keep F.linear).
MAX_FEW_ROWS = 16


def cpu_few_rows_linear(x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, computed as ``weight @ x.T`` for few CPU rows."""
    rows = x.shape[0] if x.dim() == 2 else 0
    if (not 0 < rows <= MAX_FEW_ROWS or x.device.type != "cpu"
            or x.dtype != torch.float32 or weight.dtype != torch.float32):
        return F.linear(x, weight, bias)
    columns = x.repeat(2, 1) if rows == 1 else x  # one column would take the 1-core path
    out = torch.mm(weight, columns.t())[:, :rows].t().contiguous()
    return out.add_(bias) if bias is not None else out


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and names) with ``cpu_few_rows_linear`` products."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_few_rows_linear(x, self.weight, self.bias)
