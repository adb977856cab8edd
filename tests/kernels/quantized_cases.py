"""Quantized weights of every layout the CPU kernels take, and the integer arithmetic they
promise done in PyTorch (``emulate``): activations rounded to int16 per block of 32 (scale
amax / 32767, round to nearest), products in float64, so the only difference a kernel may
show is float32 rounding. Shared by the dot-product and GEMM kernels' tests.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int16 steps per block of 32, as float64 values (q * d). The step and the
    rounding are computed in float32 as the kernel does (``x * (1 / d)``, ties to even)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 32767
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse)
    assert q.abs().max() <= 32767
    return (q.double() * d.double()).reshape(x.shape)


def emulate(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    w = dequantize_weight(weight).double()
    if weight.mins is None:
        out = quantize_activations(x) @ w.T
    else:
        mins = weight.mins.double().repeat_interleave(weight.group_size, dim=1)
        out = quantize_activations(x) @ (w - mins).T + x.double() @ mins.T
    return (out + (0 if bias is None else bias.double())).float()


def weights(kind: str, n: int, k: int) -> QuantizedWeight:
    w = torch.randn(n, k) * 0.05
    if kind == "int8-channel":
        return quantize_int8(w)
    if kind == "int8-g32":
        return quantize_int8(w, 32)
    if kind == "int8-g32-fp16":  # GGUF's Q8_0
        qw = quantize_int8(w, 32)
        return QuantizedWeight(qw.qweight, qw.scales.half(), None, 8, 32, k)
    if kind == "int8-g64-fp16":
        qw = quantize_int8(w, 64)
        return QuantizedWeight(qw.qweight, qw.scales.half(), None, 8, 64, k)
    if kind == "int8-g16":  # GGUF's Q6_K: two scales per activation block
        return quantize_int8(w, 16)
    if kind in ("int8-g32-mins-fp16", "int8-g64-mins"):  # GGUF's Q5_1 (fp16), Q5_K (fp32)
        group = 32 if kind.endswith("fp16") else 64
        qw = quantize_int8(w, group)
        dtype = torch.float16 if kind.endswith("fp16") else torch.float32
        mins = (torch.randn(n, k // group) * 0.05).to(dtype)
        return QuantizedWeight(qw.qweight, qw.scales.to(dtype), mins, 8, group, k)
    if kind == "int4-g32":
        return quantize_int4(w, 32)
    if kind == "int4-g32-fp32":  # GGUF's Q4_K sub-blocks
        qw = quantize_int4(w, 32)
        assert qw.mins is not None
        return QuantizedWeight(qw.qweight, qw.scales.float(), qw.mins.float(), 4, 32, k)
    if kind == "int4-g64-fp32":
        qw = quantize_int4(w, 64)
        assert qw.mins is not None
        return QuantizedWeight(qw.qweight, qw.scales.float(), qw.mins.float(), 4, 64, k)
    raise AssertionError(kind)


def with_mins(qw: QuantizedWeight, dtype: torch.dtype) -> QuantizedWeight:
    """``qw`` given zero minimums of ``dtype`` (unchecked: the kernel's own checks judge)."""
    return QuantizedWeight(qw.qweight, qw.scales, torch.zeros(qw.scales.shape, dtype=dtype), 8,
                           qw.group_size, qw.in_features)


KINDS = ("int8-channel", "int8-g32", "int8-g32-fp16", "int8-g64-fp16", "int8-g16",
         "int8-g32-mins-fp16", "int8-g64-mins", "int4-g32", "int4-g32-fp32", "int4-g64-fp32")
