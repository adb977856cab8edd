"""Public entry points: RMSNorm and the fused residual-add + RMSNorm.

CUDA takes the Triton kernels; float32 on CPU the C++ ones (``cpu_kernels/rms_norm.cpp``,
one pass per row); everything else the reference.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.backend import cpu_float32_kernel, select_backend
from kvrelay_kernels.checks import (
    FLOAT_DTYPES,
    KernelArgumentError,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
)
from kvrelay_kernels.reference.norm import fused_add_rms_norm_reference, rms_norm_reference


def _check_norm_args(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() < 1:
        raise KernelArgumentError("x must have at least one dimension")
    check_shape("weight", weight, (x.shape[-1],))
    check_dtype("x", x, FLOAT_DTYPES)
    check_dtype("weight", weight, FLOAT_DTYPES)
    check_same_device(x=x, weight=weight)
    check_last_dim_contiguous("x", x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension (float32 statistics)."""
    _check_norm_args(x, weight)
    if x.numel() > 0 and select_backend(x.device) == "triton":
        from kvrelay_kernels.triton_kernels.norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    if x.is_contiguous() and cpu_float32_kernel(x, weight):
        return torch.ops.kvrelay_cpu.rms_norm(x, weight.contiguous(), eps)
    return rms_norm_reference(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(rms_norm(x + residual), x + residual)`` in one pass over memory."""
    _check_norm_args(x, weight)
    check_shape("residual", residual, tuple(x.shape))
    check_same_device(x=x, residual=residual)
    if x.numel() > 0 and select_backend(x.device) == "triton":
        from kvrelay_kernels.triton_kernels.norm import fused_add_rms_norm_triton

        return fused_add_rms_norm_triton(x, residual, weight, eps)
    if x.is_contiguous() and residual.is_contiguous() and cpu_float32_kernel(x, residual, weight):
        out, summed = torch.ops.kvrelay_cpu.fused_add_rms_norm(x, residual, weight.contiguous(),
                                                                eps)
        return out, summed
    return fused_add_rms_norm_reference(x, residual, weight, eps)
