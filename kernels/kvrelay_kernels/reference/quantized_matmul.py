"""Reference weight-only quantized matmul: dequantize the whole matrix, then ``F.linear``.

The oracle of the compiled CPU path and of the Triton kernels, and the eager fallback on a
machine without a C++ compiler.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvrelay_kernels.quantized_weight import QuantizedWeight, unpack_int4


def dequantize_weight(weight: QuantizedWeight) -> torch.Tensor:
    """float32 ``[out_features, in_features]`` values of a quantized matrix.

    Computed as ``q * scale + min`` in float32 (no fused multiply-add), the same operations
    as ``gguf.quants`` so that a lossless repack dequantises to the same bits.
    """
    n, k, g = weight.out_features, weight.in_features, weight.group_size
    values = weight.qweight.float() if weight.bits == 8 else unpack_int4(weight.qweight).float()
    grouped = values.reshape(n, k // g, g) * weight.scales.float()[..., None]
    if weight.mins is not None:
        grouped = grouped + weight.mins.float()[..., None]
    return grouped.reshape(n, k)


def quantized_matmul_reference(x: torch.Tensor, weight: QuantizedWeight,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(weight).T + bias`` in float32, returned in ``x``'s dtype."""
    out = F.linear(x.float(), dequantize_weight(weight),
                   None if bias is None else bias.float())
    return out.to(x.dtype)
