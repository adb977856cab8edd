# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""RMSNorm and residual-add + RMSNorm, one program per row, the row held in registers.

Rounding follows the reference (Hugging Face's order): statistics in float32, the
normalised row rounded to the input dtype, then multiplied by the weight in the promoted
dtype of the two. The fused version rounds the sum to its dtype before normalising it, as
the unfused model would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrelay_kernels.reference.norm import fused_add_rms_norm_reference, rms_norm_reference

# Rows longer than this do not fit one program's registers; they take the reference.
_MAX_ROW = 65536


@triton.jit
def _normalise(x, w_ptr, offs, mask, n_cols, eps, X_DTYPE: tl.constexpr):
    """``weight * round(x * rsqrt(mean(x^2) + eps))`` in float32 (x already float32)."""
    mean_square = tl.sum(x * x, 0) / n_cols
    normed = (x * tl.rsqrt(mean_square + eps)).to(X_DTYPE).to(tl.float32)
    weight = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return normed * weight


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, stride_x, stride_out, n_cols, eps, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    result = _normalise(x.to(tl.float32), w_ptr, offs, mask, n_cols, eps, x.dtype)
    tl.store(out_ptr + row * stride_out + offs, result.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr, residual_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_r, stride_out, stride_sum, n_cols, eps, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
    summed = (residual.to(tl.float32) + x).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * stride_sum + offs, summed, mask=mask)
    result = _normalise(summed.to(tl.float32), w_ptr, offs, mask, n_cols, eps, summed.dtype)
    tl.store(out_ptr + row * stride_out + offs, result.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_options(n_cols: int) -> tuple[int, int]:
    block = triton.next_power_of_2(n_cols)
    return block, min(16, max(1, block // 512))


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` over the last dimension; a new tensor shaped like ``x``."""
    n_cols = x.shape[-1]
    if n_cols > _MAX_ROW:
        return rms_norm_reference(x, weight, eps)
    rows = x.reshape(-1, n_cols)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0] > 0:
        block, num_warps = _launch_options(n_cols)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight.contiguous(), out, rows.stride(0), out.stride(0), n_cols, eps,
            BLOCK=block, num_warps=num_warps,
        )
    return out.view(x.shape)


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``, reading each input once."""
    n_cols = x.shape[-1]
    if n_cols > _MAX_ROW:
        return fused_add_rms_norm_reference(x, residual, weight, eps)
    rows = x.reshape(-1, n_cols)
    res_rows = residual.reshape(-1, n_cols)
    if res_rows.stride(-1) != 1:
        res_rows = res_rows.contiguous()
    sum_dtype = torch.promote_types(x.dtype, residual.dtype)
    summed = torch.empty(rows.shape, dtype=sum_dtype, device=x.device)
    out = torch.empty(rows.shape, dtype=torch.promote_types(sum_dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0] > 0:
        block, num_warps = _launch_options(n_cols)
        _fused_add_rms_norm_kernel[(rows.shape[0],)](
            rows, res_rows, weight.contiguous(), out, summed,
            rows.stride(0), res_rows.stride(0), out.stride(0), summed.stride(0), n_cols, eps,
            BLOCK=block, num_warps=num_warps,
        )
    return out.view(x.shape), summed.view(x.shape)
