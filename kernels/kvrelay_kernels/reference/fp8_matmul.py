"""Reference FP8-weight matmul: dequantize the whole matrix, then ``F.linear``.

The oracle of the C++ and Triton kernels and of the FP8-matmul path's argument
construction, and the eager fallback on a machine without a C++ compiler.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvrelay_kernels.fp8_weight import FP8_DTYPE, FP8_MAX, Fp8Weight, spread_scales


def dequantize_fp8(weight: Fp8Weight) -> torch.Tensor:
    """float32 ``[out_features, in_features]``: ``float(q) * scale``, one rounding, as
    compressed-tensors' decompression computes it."""
    return weight.weight.float() * spread_scales(weight.scales, weight.group_size,
                                                 weight.in_features)


def fp8_matmul_reference(x: torch.Tensor, weight: Fp8Weight,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(weight).T + bias`` in float32 (weight-only), in ``x``'s dtype."""
    out = F.linear(x.float(), dequantize_fp8(weight), None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_activations(x: torch.Tensor, static_scale: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[M, K]`` as float8_e4m3fn and its float32 ``[M, 1]`` scales: per token
    (``amax / 448``, as vLLM's dynamic per-token quantization) or the static scale."""
    xf = x.float()
    if static_scale is None:
        amax = xf.abs().amax(dim=-1, keepdim=True)
        scale = torch.clamp(amax / FP8_MAX, min=torch.finfo(torch.float32).tiny)
    else:
        # one value per row, a fresh [M, 1] tensor (row-wise scales must be contiguous)
        rows = torch.ones((x.shape[0], 1), dtype=torch.float32, device=x.device)
        scale = rows * static_scale.float().reshape(1, 1)
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_w8a8_reference(x: torch.Tensor, weight: Fp8Weight,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """What an FP8 matmul computes: activations quantized as ``quantize_activations``,
    exact products summed in float32, then both scales (per-channel weights only)."""
    static = weight.input_scale if weight.activations == "static" else None
    q, scale = quantize_activations(x, static)
    out = (q.float() @ weight.weight.float().T) * scale * weight.scales.reshape(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
