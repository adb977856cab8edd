# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""Batched LoRA on the GPU: a shrink kernel and an expand kernel over segments of rows.

The rows are sorted by slot (``torch.sort``), so each adapter's rows form one contiguous
segment of the sorted order, and ``starts[s]`` (``torch.searchsorted``) is where slot
``s``'s segment begins; rows of slot -1 sort first and belong to no segment. Both kernels
launch over (row tile, ...): each program finds its segment and the tile within it on the
device, from ``starts`` (tiles per segment, their running sum, the segment whose range
holds the program's tile), so the host reads no device value and the launch can be
captured in a CUDA graph. The grid is sized for the worst case, ``cdiv(T, BLOCK_M)``
full tiles plus one partial tile per segment; programs past the last tile return at once.

- shrink: ``h[m] = x[order[m]] @ A[s].T``, ``[BLOCK_M, R]`` per program, in float32,
  split along ``in`` when the row tiles alone would leave the device idle (decode);
  each split writes its own partial sums. The product is taken in the activations'
  dtype, or in float32 (IEEE) where the adapters have another dtype, so that neither
  operand is rounded to the other's.
- expand: ``y[order[m], n] += h[m] @ B[s][n].T`` per ``[BLOCK_M, BLOCK_N]`` tile of the
  output: the partial sums are added in a fixed order (the same bits every run), the
  product is taken in float32 (TF32 for 16-bit activations, IEEE for float32) and added
  to ``y`` in float32 before one rounding to its dtype.

A row's slot outside ``[0, S)`` lies in no segment: the row is left unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvrelay_kernels.triton_kernels.dot import mma, mma_precision, mma_widen
from kvrelay_kernels.triton_kernels.launch_config import sm_count

BLOCK_N = 64
# Inputs per shrink loop step.
BLOCK_K = 64
# Shrink programs aim for this many per multiprocessor, splitting ``in`` to get there...
SHRINK_PROGRAMS_PER_SM = 2
# ...giving each split at least this many ``BLOCK_K`` steps, and at most this many splits.
SHRINK_MIN_STEPS = 4
SHRINK_MAX_SPLITS = 16


@triton.jit
def _find_tile(starts_ptr, num_slots, BLOCK_M: tl.constexpr, SLOTS_PAD: tl.constexpr):
    """``(slot, first sorted row of the tile, end of the slot's segment)`` of this
    program's tile; ``slot == num_slots`` when the program has no tile."""
    tile = tl.program_id(0)
    r = tl.arange(0, SLOTS_PAD)
    ok = r < num_slots
    lo = tl.load(starts_ptr + r, mask=ok, other=0)
    hi = tl.load(starts_ptr + r + 1, mask=ok, other=0)
    tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, 0)
    slot = tl.sum((ok & (tile_end <= tile)).to(tl.int32), 0)
    mine = r == slot
    first_tile = tl.sum(tl.where(mine, tile_end - tiles, 0), 0)
    row = tl.sum(tl.where(mine, lo, 0), 0) + (tile - first_tile) * BLOCK_M
    return slot, row, tl.sum(tl.where(mine, hi, 0), 0)


@triton.jit(do_not_specialize=["num_rows", "stride_xm"])
def _lora_shrink_kernel(x_ptr, a_ptr, order_ptr, starts_ptr, h_ptr, num_rows, num_slots,
                        in_features, rank, stride_xm, steps_per_split,
                        PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                        RANK_PAD: tl.constexpr, SLOTS_PAD: tl.constexpr):
    slot, row, seg_end = _find_tile(starts_ptr, num_slots, BLOCK_M, SLOTS_PAD)
    if slot >= num_slots:
        return
    split = tl.program_id(1)
    m = row + tl.arange(0, BLOCK_M)
    m_ok = m < seg_end
    t = tl.load(order_ptr + m, mask=m_ok, other=0).to(tl.int64)
    rr = tl.arange(0, RANK_PAD)
    r_ok = rr < rank
    a_rows = a_ptr + slot.to(tl.int64) * rank * in_features + rr.to(tl.int64) * in_features
    start = split * steps_per_split * BLOCK_K
    stop = tl.minimum(start + steps_per_split * BLOCK_K, in_features)
    acc = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
    for k0 in range(start, stop, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < stop
        x = tl.load(x_ptr + t[:, None] * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_rows[None, :] + rk[:, None], mask=k_ok[:, None] & r_ok[None, :],
                    other=0.0)
        acc += mma(x, a, PRECISION, WIDEN)  # WIDEN where the dtypes differ
    h = h_ptr + (split * num_rows + m.to(tl.int64))[:, None] * rank + rr[None, :]
    tl.store(h, acc, mask=m_ok[:, None] & r_ok[None, :])


@triton.jit(do_not_specialize=["num_rows", "stride_ym"])
def _lora_expand_kernel(y_ptr, b_ptr, order_ptr, starts_ptr, h_ptr, num_rows, num_slots,
                        out_features, rank, stride_ym, num_splits,
                        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, RANK_PAD: tl.constexpr,
                        SLOTS_PAD: tl.constexpr):
    slot, row, seg_end = _find_tile(starts_ptr, num_slots, BLOCK_M, SLOTS_PAD)
    if slot >= num_slots:
        return
    m = row + tl.arange(0, BLOCK_M)
    m_ok = m < seg_end
    rr = tl.arange(0, RANK_PAD)
    r_ok = rr < rank
    h_ok = m_ok[:, None] & r_ok[None, :]
    h_rows = h_ptr + m.to(tl.int64)[:, None] * rank + rr[None, :]
    h = tl.zeros((BLOCK_M, RANK_PAD), dtype=tl.float32)
    for split in range(num_splits):
        h += tl.load(h_rows + split * num_rows * rank, mask=h_ok, other=0.0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < out_features
    b = tl.load(b_ptr + slot.to(tl.int64) * out_features * rank
                + rn.to(tl.int64)[None, :] * rank + rr[:, None],
                mask=r_ok[:, None] & n_ok[None, :], other=0.0)
    delta = tl.dot(h, b.to(tl.float32), input_precision=PRECISION)
    t = tl.load(order_ptr + m, mask=m_ok, other=0).to(tl.int64)
    y = y_ptr + t[:, None] * stride_ym + rn[None, :]
    y_ok = m_ok[:, None] & n_ok[None, :]
    total = tl.load(y, mask=y_ok, other=0.0).to(tl.float32) + delta
    tl.store(y, total.to(y_ptr.dtype.element_ty), mask=y_ok)


@dataclass(frozen=True)
class LoraPlan:
    """How one call's shapes are launched: row tiles, the shrink's split of ``in``."""

    block_m: int
    rank_pad: int
    slots_pad: int
    max_tiles: int  # grid rows: every full tile plus one partial tile per segment
    num_splits: int
    steps_per_split: int


@functools.lru_cache(maxsize=4096)
def plan_lora(rows: int, slots: int, in_features: int, rank: int, sms: int,
              num_splits: int | None = None) -> LoraPlan:
    """The launch of ``rows`` rows over ``slots`` adapters on ``sms`` multiprocessors
    (shapes only: every layer of a step asks with the same ones)."""
    block_m = 16 if rows <= 128 else (32 if rows <= 512 else 64)
    max_tiles = triton.cdiv(rows, block_m) + min(slots, rows)
    steps = triton.cdiv(in_features, BLOCK_K)
    if num_splits is None:
        wanted = triton.cdiv(SHRINK_PROGRAMS_PER_SM * sms, max_tiles)
        num_splits = min(wanted, steps // SHRINK_MIN_STEPS, SHRINK_MAX_SPLITS)
    num_splits = max(1, min(num_splits, steps))
    steps_per_split = triton.cdiv(steps, num_splits)
    num_splits = triton.cdiv(steps, steps_per_split)  # no split left without inputs
    return LoraPlan(block_m, max(16, triton.next_power_of_2(rank)),
                    max(16, triton.next_power_of_2(slots)), max_tiles, num_splits,
                    steps_per_split)


def lora_apply_triton(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor,
                      lora_b: torch.Tensor, row_slots: torch.Tensor,
                      num_splits: int | None = None) -> torch.Tensor:
    """In place on ``y``; arguments checked by the caller (``lora.check_lora_args``), at
    least one row, slot and rank. ``num_splits`` overrides the planned split (tests)."""
    rows, in_features = x.shape
    slots, rank, _ = lora_a.shape
    out_features = y.shape[1]
    plan = plan_lora(rows, slots, in_features, rank, sm_count(x.device), num_splits)
    sorted_slots, order = torch.sort(row_slots)
    slot_ids = torch.arange(slots + 1, dtype=sorted_slots.dtype, device=x.device)
    starts = torch.searchsorted(sorted_slots, slot_ids)
    h = torch.empty((plan.num_splits, rows, rank), dtype=torch.float32, device=x.device)
    widen = lora_a.dtype != x.dtype or mma_widen(x.dtype)
    _lora_shrink_kernel[(plan.max_tiles, plan.num_splits)](
        x, lora_a, order, starts, h, rows, slots, in_features, rank, x.stride(0),
        plan.steps_per_split, PRECISION=mma_precision(x.dtype), WIDEN=widen,
        BLOCK_M=plan.block_m, BLOCK_K=BLOCK_K, RANK_PAD=plan.rank_pad,
        SLOTS_PAD=plan.slots_pad,
    )
    _lora_expand_kernel[(plan.max_tiles, triton.cdiv(out_features, BLOCK_N))](
        y, lora_b, order, starts, h, rows, slots, out_features, rank, y.stride(0),
        plan.num_splits, PRECISION=mma_precision(x.dtype), BLOCK_M=plan.block_m,
        BLOCK_N=BLOCK_N, RANK_PAD=plan.rank_pad, SLOTS_PAD=plan.slots_pad,
    )
    return y
