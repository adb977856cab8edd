# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""FP8-weight GEMM for GPUs without FP8 matmuls: ``x @ (fp8(W) * scales).T``.

The float8_e4m3fn weight is read as its bytes (uint8) and converted to float32 in the
tile loop with integer operations, so the kernel needs no native FP8 support (Ampere and
older, and Triton's CPU interpreter, where the tests run it): the bits ``eeee mmm`` go
under float32's exponent and mantissa with the exponent re-biased (+120); a subnormal
(``eeee == 0``) is built one exponent higher and ``2**-6`` subtracted; the sign is
copied. Exact for every finite value (the NaN encodings, which quantizers never write,
read as +-480). The float weight never goes to memory.

One scale per channel is applied to the finished tile (``PER_CHANNEL``); groups (FP8_BLOCK's
128 inputs, possibly a partial last one) scale each converted weight before the product.
Activations stay in the model's dtype: weight-only, as on the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrelay_kernels.fp8_weight import Fp8Weight
from kvrelay_kernels.triton_kernels.dot import mma, mma_precision, mma_widen

BLOCK_N = 64
BLOCK_K = 32


@triton.jit
def fp8_e4m3_to_float(u):
    """int32 bytes (0..255) of float8_e4m3fn values -> their float32 values."""
    bits = ((u & 0x7F) << 20) + (120 << 23)
    subnormal = (u & 0x78) == 0
    bits = tl.where(subnormal, bits + (1 << 23), bits)
    value = bits.to(tl.float32, bitcast=True)
    value = tl.where(subnormal, value - 0.015625, value)
    return tl.where((u & 0x80) != 0, -value, value)


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_om"])
def _fp8_matmul_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_om,
                       groups, GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
                       HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & n_ok[None, :]
        u = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=w_ok, other=0)
        w = fp8_e4m3_to_float(u.to(tl.int32))
        if not PER_CHANNEL:
            w *= tl.load(s_ptr + rn[None, :] * groups + (rk // GROUP)[:, None], mask=w_ok,
                         other=0.0)
        acc += mma(x, w.to(x.dtype), PRECISION, WIDEN)
    if PER_CHANNEL:
        acc *= tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def fp8_matmul_triton(x: torch.Tensor, weight: Fp8Weight,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """2-D contiguous ``x`` ``[M, K]`` -> ``[M, N]`` in ``x``'s dtype (checked by the caller)."""
    m, k = x.shape
    n = weight.out_features
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N))
    _fp8_matmul_kernel[grid](
        x, weight.weight.view(torch.uint8), weight.scales, bias if bias is not None else x,
        out, m, n, k, x.stride(0), n, weight.scales.shape[1], GROUP=weight.group_size,
        PER_CHANNEL=weight.per_channel, HAS_BIAS=bias is not None,
        PRECISION=mma_precision(x.dtype), WIDEN=mma_widen(x.dtype), BLOCK_M=block_m,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return out
