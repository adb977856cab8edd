# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""W8A16 / W4A16 GEMM: ``x @ dequantize(W).T`` with the dequantization in the tile loop.

Each program owns a ``BLOCK_M x BLOCK_N`` tile of the output and walks its share of the
packed columns in ``BLOCK_K`` steps. int8: one column is one input. int4: byte ``j`` of a
row holds input ``j`` in its low nibble and input ``j + K/2`` in its high one
(``kvrelay_kernels.quantized_weight``), so each byte tile is loaded once and feeds two
products, one per half. The float weight never goes to memory: at batch 1 the kernel
reads the packed bytes once.

Scales: when every tile lies inside one quantization group (``TILE_IN_GROUP``: the
group is a multiple of ``BLOCK_K`` and, for int4, ``K/2`` is a multiple of the group), a
tile's scales (and minimums) are one vector over its ``BLOCK_N`` outputs, applied to the
product: ``x @ (q * s + m) = s * (x @ q) + m * sum(x)``; ``q`` is exact in the
activations' dtype. Otherwise (odd shapes) each weight element is scaled before the
product, its group found per input. int8 may carry minimums as int4 does (GGUF's Q5_1 and
Q5_K); groups of 16 (Q6_K) are narrower than a K tile, so they take the per-element path.

Split-K: with few rows (decode batches) the output tiles alone do not fill the device
(N = 4096 is 64 programs), so the columns are split among ``num_splits`` programs per
tile, each writing float32 partial sums that one reduction adds in a fixed order (the
same bits every run, as CUDA graphs and greedy checks need).

Offsets are 64-bit: ``n * K`` passes 2**31 in a large layer (an LM head of 128k rows).
``M`` is not specialised on, so a new batch size reuses the compiled kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.triton_kernels.dot import mma, mma_precision, mma_widen
from kvrelay_kernels.triton_kernels.launch_config import sm_count

BLOCK_N = 64
# Rows at or under which a product is a decode-sized one and split along K.
SPLIT_K_MAX_ROWS = 16
# Split-K aims for this many programs per multiprocessor...
SPLIT_K_PROGRAMS_PER_SM = 2
# ...giving each split at least this many column tiles, and at most this many splits.
SPLIT_K_MIN_TILES = 4
SPLIT_K_MAX_SPLITS = 16


@triton.jit
def _accumulate(acc, x_ptr, rm, m_ok, stride_xm, rk, k_ok, values, k_first, rn, n_ok,
                s_ptr, m_ptr, groups, GROUP: tl.constexpr, HAS_MIN: tl.constexpr,
                TILE_IN_GROUP: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``acc`` plus the product of the inputs ``rk`` of ``x`` with their weight ``values``
    (``[BLOCK_K, BLOCK_N]`` quantized integers as floats, not yet scaled)."""
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :],
                mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    if TILE_IN_GROUP:
        group = rn * groups + k_first // GROUP
        scale = tl.load(s_ptr + group, mask=n_ok, other=0.0).to(tl.float32)
        acc += mma(x, values.to(x.dtype), PRECISION, WIDEN) * scale[None, :]
        if HAS_MIN:
            low = tl.load(m_ptr + group, mask=n_ok, other=0.0).to(tl.float32)
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * low[None, :]
    else:
        w_ok = k_ok[:, None] & n_ok[None, :]
        groups_of = rn[None, :] * groups + (rk // GROUP)[:, None]
        w = values * tl.load(s_ptr + groups_of, mask=w_ok, other=0.0).to(tl.float32)
        if HAS_MIN:
            w += tl.load(m_ptr + groups_of, mask=w_ok, other=0.0).to(tl.float32)
        acc += mma(x, w.to(x.dtype), PRECISION, WIDEN)
    return acc


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_om"])
def _quantized_matmul_kernel(x_ptr, q_ptr, s_ptr, m_ptr, b_ptr, out_ptr, M, N, K,
                             stride_xm, stride_om, stride_split, tiles_per_split,
                             GROUP: tl.constexpr, BITS: tl.constexpr, HAS_MIN: tl.constexpr,
                             HAS_BIAS: tl.constexpr, TILE_IN_GROUP: tl.constexpr,
                             PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_ok = rm < M
    n_ok = rn < N
    groups = K // GROUP
    # Packed columns of one weight row: inputs (int8) or bytes of two nibbles (int4).
    span = K if BITS == 8 else K // 2
    start = pid_k * tiles_per_split * BLOCK_K
    stop = tl.minimum(start + tiles_per_split * BLOCK_K, span)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(start, stop, BLOCK_K):
        rc = c0 + tl.arange(0, BLOCK_K)
        c_ok = rc < stop
        q = tl.load(q_ptr + rn[None, :] * span + rc[:, None],
                    mask=c_ok[:, None] & n_ok[None, :], other=0)
        if BITS == 8:
            acc = _accumulate(acc, x_ptr, rm, m_ok, stride_xm, rc, c_ok, q.to(tl.float32),
                              c0, rn, n_ok, s_ptr, m_ptr, groups, GROUP, HAS_MIN,
                              TILE_IN_GROUP, PRECISION, WIDEN)
        else:
            packed = q.to(tl.int32)
            acc = _accumulate(acc, x_ptr, rm, m_ok, stride_xm, rc, c_ok,
                              (packed & 15).to(tl.float32), c0, rn, n_ok, s_ptr, m_ptr,
                              groups, GROUP, HAS_MIN, TILE_IN_GROUP, PRECISION, WIDEN)
            acc = _accumulate(acc, x_ptr, rm, m_ok, stride_xm, rc + span, c_ok,
                              (packed >> 4).to(tl.float32), c0 + span, rn, n_ok, s_ptr,
                              m_ptr, groups, GROUP, HAS_MIN, TILE_IN_GROUP, PRECISION, WIDEN)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + pid_k * stride_split + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class MatmulPlan:
    """How one shape is launched: tiles, the K split, and the scale path."""

    block_m: int
    block_k: int
    num_splits: int
    tiles_per_split: int
    tile_in_group: bool


@functools.lru_cache(maxsize=4096)
def plan_quantized_matmul(m: int, n: int, k: int, bits: int, group: int, sms: int,
                          num_splits: int | None = None) -> MatmulPlan:
    """The launch of an ``[m, k] x [n, k]`` product on a device of ``sms`` multiprocessors
    (planned once per shape: decode calls every layer every step with the same shapes)."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    block_k = 64 if group % 64 == 0 else (32 if group % 32 == 0 else 64)
    span = k if bits == 8 else k // 2
    tile_in_group = k // group == 1 or (
        group % block_k == 0 and (bits == 8 or (k // 2) % group == 0))
    tiles = triton.cdiv(span, block_k)
    if num_splits is None:
        num_splits = 1
        if m <= SPLIT_K_MAX_ROWS:
            programs = triton.cdiv(m, block_m) * triton.cdiv(n, BLOCK_N)
            wanted = triton.cdiv(SPLIT_K_PROGRAMS_PER_SM * sms, programs)
            num_splits = max(1, min(wanted, tiles // SPLIT_K_MIN_TILES, SPLIT_K_MAX_SPLITS))
    num_splits = max(1, min(num_splits, tiles))
    tiles_per_split = triton.cdiv(tiles, num_splits)
    num_splits = triton.cdiv(tiles, tiles_per_split)  # no split left without columns
    return MatmulPlan(block_m, block_k, num_splits, tiles_per_split, tile_in_group)


def quantized_matmul_triton(x: torch.Tensor, weight: QuantizedWeight,
                            bias: torch.Tensor | None,
                            num_splits: int | None = None) -> torch.Tensor:
    """2-D contiguous ``x`` ``[M, K]`` -> ``[M, N]`` in ``x``'s dtype (checked by the caller).

    ``num_splits`` overrides the planned K split (tests)."""
    m, k = x.shape
    n = weight.out_features
    plan = plan_quantized_matmul(m, n, k, weight.bits, weight.group_size,
                                 sm_count(x.device), num_splits)
    split = plan.num_splits > 1
    out = (torch.empty((plan.num_splits, m, n), dtype=torch.float32, device=x.device)
           if split else torch.empty((m, n), dtype=x.dtype, device=x.device))
    grid = (triton.cdiv(m, plan.block_m), triton.cdiv(n, BLOCK_N), plan.num_splits)
    mins = weight.mins if weight.mins is not None else weight.scales
    _quantized_matmul_kernel[grid](
        x, weight.qweight, weight.scales, mins, bias if bias is not None else x, out,
        m, n, k, x.stride(0), n, m * n if split else 0, plan.tiles_per_split,
        GROUP=weight.group_size, BITS=weight.bits, HAS_MIN=weight.mins is not None,
        HAS_BIAS=bias is not None and not split, TILE_IN_GROUP=plan.tile_in_group,
        PRECISION=mma_precision(x.dtype), WIDEN=mma_widen(x.dtype), BLOCK_M=plan.block_m,
        BLOCK_N=BLOCK_N, BLOCK_K=plan.block_k,
    )
    if not split:
        return out
    total = out.sum(dim=0)
    if bias is not None:
        total += bias.float()
    return total.to(x.dtype)
