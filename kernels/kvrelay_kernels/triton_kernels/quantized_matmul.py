# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""W8A16 / W4A16 GEMM: ``x @ dequantize(W).T`` with the dequantization in the tile loop.

Each program owns a ``BLOCK_M x BLOCK_N`` tile of the output and walks K in ``BLOCK_K``
steps: it loads the packed weight bytes of its ``BLOCK_K x BLOCK_N`` slice, turns them into
values (int8 as is; int4 from the low nibble in the row's first half, the high nibble in
its second: ``kvrelay_kernels.quantized_weight``), applies each input's group scale (and
minimum) and multiplies into a float32 accumulator. The float weight never goes to memory,
so at batch 1 the kernel reads the packed bytes once.

Indexing is per element (group = k // group_size, byte and nibble from k), so any K,
group size and partial tile works; masks cover the edges.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.triton_kernels.dot import mma, mma_precision, mma_widen

BLOCK_N = 64
BLOCK_K = 64


@triton.jit
def _quantized_matmul_kernel(x_ptr, q_ptr, s_ptr, m_ptr, b_ptr, out_ptr, M, N, K,
                             stride_xm, stride_om,
                             GROUP: tl.constexpr, BITS: tl.constexpr, HAS_MIN: tl.constexpr,
                             HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                             WIDEN: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    groups = K // GROUP
    half = K // 2
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & n_ok[None, :]
        if BITS == 8:
            q = tl.load(q_ptr + rn[None, :] * K + rk[:, None], mask=w_ok, other=0)
            values = q.to(tl.float32)
        else:
            high = rk >= half
            byte = tl.where(high, rk - half, rk)
            packed = tl.load(q_ptr + rn[None, :] * half + byte[:, None], mask=w_ok,
                             other=0).to(tl.int32)
            values = tl.where(high[:, None], packed >> 4, packed & 15).to(tl.float32)
        group = rn[None, :] * groups + (rk // GROUP)[:, None]
        w = values * tl.load(s_ptr + group, mask=w_ok, other=0.0).to(tl.float32)
        if HAS_MIN:
            w += tl.load(m_ptr + group, mask=w_ok, other=0.0).to(tl.float32)
        acc += mma(x, w.to(x.dtype), PRECISION, WIDEN)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def quantized_matmul_triton(x: torch.Tensor, weight: QuantizedWeight,
                            bias: torch.Tensor | None) -> torch.Tensor:
    """2-D contiguous ``x`` ``[M, K]`` -> ``[M, N]`` in ``x``'s dtype (checked by the caller)."""
    m, k = x.shape
    n = weight.out_features
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, BLOCK_N))
    mins = weight.mins if weight.mins is not None else weight.scales
    _quantized_matmul_kernel[grid](
        x, weight.qweight, weight.scales, mins, bias if bias is not None else x, out,
        m, n, k, x.stride(0), out.stride(0),
        GROUP=weight.group_size, BITS=weight.bits, HAS_MIN=weight.mins is not None,
        HAS_BIAS=bias is not None, PRECISION=mma_precision(x.dtype),
        WIDEN=mma_widen(x.dtype), BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return out
