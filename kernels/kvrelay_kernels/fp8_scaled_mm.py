"""FP8 matmuls (``torch._scaled_mm``) for FP8 weights, where the GPU has them.

On compute capability 8.9 and later (Ada, Hopper, Blackwell) the tensor cores multiply
FP8 by FP8; as vLLM does for compressed-tensors FP8 checkpoints, the activations are
quantized to float8_e4m3fn first, per token at run time (``FP8_DYNAMIC``: ``amax / 448``
per row) or with the checkpoint's static scale (``FP8``), and the weight goes in as
stored. The scales are applied by ``_scaled_mm`` itself: row-wise (activation scale per
row ``[M, 1]``, weight scale per channel ``[1, N]``) with a bfloat16 result, the one
output type every torch release's row-wise kernel accepts; for float16 and float32 models
the product is taken tensor-wise with unit scales into float32 and both scales are
multiplied in afterwards. The weight is passed as ``weight.t()``: the column-major
``[K, N]`` operand ``_scaled_mm`` requires, without a copy.

What ``_scaled_mm`` needs besides (``torch/_meta_registrations.py``): K and N multiples
of 16, one scale per channel (FP8_BLOCK's 128x128 blocks take the Triton kernel), and
quantized activations: a weight-only FP8 checkpoint (no activation scheme) takes the
Triton kernel too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kvrelay_kernels.fp8_weight import Fp8Weight
from kvrelay_kernels.reference.fp8_matmul import quantize_activations

# The first compute capability with FP8 tensor cores (Ada Lovelace, sm_89).
FP8_MIN_CAPABILITY = (8, 9)


def fp8_matmul_supported(device: torch.device) -> bool:
    """Whether ``device`` multiplies FP8 matrices natively (and torch exposes it)."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index) >= FP8_MIN_CAPABILITY


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    """Asked once per device: every FP8 layer asks on every step."""
    return torch.cuda.get_device_capability(index)


def scaled_mm_serves(weight: Fp8Weight) -> bool:
    """Whether the FP8-matmul path takes ``weight`` (see the module docstring)."""
    return (weight.activations != "none" and weight.per_channel
            and weight.in_features % 16 == 0 and weight.out_features % 16 == 0)


@dataclass(frozen=True)
class ScaledMmArgs:
    """The arguments of one ``torch._scaled_mm`` call, and the scales applied after it."""

    a: torch.Tensor  # float8_e4m3fn [M, K], row-major
    b: torch.Tensor  # float8_e4m3fn [K, N], column-major (the weight, transposed)
    scale_a: torch.Tensor  # float32 [M, 1] row-wise, or a unit scalar
    scale_b: torch.Tensor  # float32 [1, N] row-wise, or a unit scalar
    out_dtype: torch.dtype
    row_scale: torch.Tensor | None = None  # [M, 1], when applied after the product
    column_scale: torch.Tensor | None = None  # [1, N], likewise


def scaled_mm_args(x: torch.Tensor, weight: Fp8Weight) -> ScaledMmArgs:
    """``x`` (2-D, contiguous) quantized, and how ``_scaled_mm`` multiplies it by ``weight``."""
    static = weight.input_scale if weight.activations == "static" else None
    a, row_scale = quantize_activations(x, static)
    b = weight.weight.t()
    column_scale = weight.scales.reshape(1, -1)
    if x.dtype == torch.bfloat16:
        return ScaledMmArgs(a, b, row_scale, column_scale, torch.bfloat16)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    return ScaledMmArgs(a, b, one, one, torch.float32, row_scale, column_scale)


def fp8_scaled_matmul(x: torch.Tensor, weight: Fp8Weight,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` on FP8 tensor cores, in ``x``'s dtype (``x`` 2-D, contiguous)."""
    args = scaled_mm_args(x, weight)
    out = torch._scaled_mm(args.a, args.b, scale_a=args.scale_a, scale_b=args.scale_b,
                           out_dtype=args.out_dtype)
    if args.row_scale is not None and args.column_scale is not None:
        out = out * args.row_scale * args.column_scale
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype)
