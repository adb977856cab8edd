"""Batched LoRA on the CPU over rows grouped by adapter once per step, not once per call.

A step runs ``lora_apply`` for every group of every wrapped linear of every layer (a
hundred calls and more) over the same rows: sorting and grouping the slots in each call,
then a pair of small matmuls per adapter, costs more than the LoRA arithmetic itself on a
few CPU cores. ``LoraSegments`` groups the step's host slots once (numpy, no device read)
into a plan every call of the step shares:

- runs: a prompt's rows are consecutive and share a slot; a run of at least ``RUN_MIN``
  such rows is added in place, ``y[run] += (x[run] @ A.T) @ B.T`` (``addmm_``), with no
  gather, scatter or delta buffer (float32 only: ``addmm_`` would round other dtypes).
- gathered: the other rows (decode: one per sequence, slots interleaved) are sorted by
  slot with one ``index_select``, multiplied, and added back with one ``index_add_``.
  When every slot's rows padded to the largest count add at most ``MAX_PADDING`` rows,
  both products are one ``torch.bmm`` each over ``[P, M, in]`` (the padding rows'
  intermediate is zeroed, so they add exact zeros); otherwise a pair of matmuls per slot.

Products and sums are taken in float32, with one rounding to ``y``'s dtype, as in
``lora_apply_reference``. A slot outside ``[0, S)`` is in no segment: its row is left
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Consecutive rows of one slot added in place rather than gathered (a prompt's rows).
RUN_MIN = 16
# Padding the gathered slots' rows to one count may add at most this share for ``bmm``.
MAX_PADDING = 0.25

Segment = tuple[int, int, int]  # (slot, start, stop)


@dataclass(frozen=True)
class SegmentPlan:
    """The step's rows grouped by slot, resolved for one stack size and device.

    ``runs``: ``(slot, first row, end row)`` added in place. The gathered rest:
    ``rows``, the row of each gathered position (None: every row, in order);
    ``segments``, each slot's positions; for ``bmm`` (``width`` > 0, the positions per
    slot) ``slots`` the present slots (a slice when consecutive, None when every slot of
    the stack) and ``pad``
    ``[P, M, 1]``, True at padding positions (None: no padding).
    """

    num_rows: int
    runs: tuple[Segment, ...]
    rows: torch.Tensor | None
    segments: tuple[Segment, ...]
    width: int
    slots: slice | torch.Tensor | None
    pad: torch.Tensor | None


class LoraSegments:
    """One step's row slots (``[T]`` on the host, -1: none), grouped the first time a
    call needs them for its ``(stack size, device, in-place runs)``, then shared."""

    def __init__(self, host_slots: torch.Tensor) -> None:
        self.host_slots = host_slots
        self._plans: dict[tuple[int, torch.device, bool], SegmentPlan] = {}

    def plan(self, num_slots: int, device: torch.device, runs: bool = True) -> SegmentPlan:
        key = (num_slots, device, runs)
        plan = self._plans.get(key)
        if plan is None:
            plan = _make_plan(self.host_slots.numpy().astype(np.int64), num_slots, device,
                              runs)
            self._plans[key] = plan
        return plan


def _long_runs(slots: np.ndarray, valid: np.ndarray) -> list[Segment]:
    """Maximal runs of one valid slot at least ``RUN_MIN`` rows long."""
    if slots.size < RUN_MIN:
        return []
    edges = np.flatnonzero(np.diff(slots)) + 1
    starts = np.concatenate(([0], edges))
    stops = np.concatenate((edges, [slots.size]))
    keep = (stops - starts >= RUN_MIN) & valid[starts]
    return [(int(slots[a]), int(a), int(b)) for a, b in zip(starts[keep], stops[keep],
                                                             strict=True)]


def _make_plan(slots: np.ndarray, num_slots: int, device: torch.device,
               runs: bool) -> SegmentPlan:
    total = int(slots.shape[0])
    valid = (slots >= 0) & (slots < num_slots)
    long_runs = _long_runs(slots, valid) if runs else []
    rest = valid.copy()
    for _, start, stop in long_runs:
        rest[start:stop] = False
    picked = np.flatnonzero(rest)
    order = picked[np.argsort(slots[picked], kind="stable")]
    present, starts, counts = np.unique(slots[order], return_index=True, return_counts=True)
    width = int(counts.max()) if counts.size else 0
    if present.size * width > (1 + MAX_PADDING) * order.size:  # per-slot matmuls
        return SegmentPlan(total, tuple(long_runs), _rows(order, total, device),
                           tuple((int(s), int(a), int(a + n)) for s, a, n
                                 in zip(present, starts, counts, strict=True)),
                           0, None, None)
    positions = np.empty((present.size, width), dtype=np.int64)
    padded = np.zeros((present.size, width), dtype=bool)
    for i, (start, count) in enumerate(zip(starts.tolist(), counts.tolist(), strict=True)):
        positions[i, :count] = order[start:start + count]
        positions[i, count:] = order[start]  # gets an exact zero added
        padded[i, count:] = True
    first, last = (int(present[0]), int(present[-1])) if present.size else (0, -1)
    slot_sel: slice | torch.Tensor | None = (
        torch.from_numpy(present.astype(np.int64)).to(device)
        if last - first + 1 != present.size
        else None if (first, last + 1) == (0, num_slots) else slice(first, last + 1))
    pad = torch.from_numpy(padded[:, :, None]).to(device) if padded.any() else None
    return SegmentPlan(total, tuple(long_runs), _rows(positions.reshape(-1), total, device),
                       tuple((int(s), i * width, (i + 1) * width)
                             for i, s in enumerate(present.tolist())),
                       width, slot_sel, pad)


def _rows(positions: np.ndarray, total: int, device: torch.device) -> torch.Tensor | None:
    """The gather index of ``positions``; None when it is every row in order."""
    if positions.size == total and bool((positions == np.arange(total)).all()):
        return None
    return torch.from_numpy(positions).to(device)


def _delta(xs: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
           plan: SegmentPlan) -> torch.Tensor:
    """``(xs @ A[s].T) @ B[s].T`` of every gathered position, ``[positions, out]``."""
    if plan.width:
        count = len(plan.segments)
        a = (lora_a if plan.slots is None else lora_a[plan.slots]).float()
        b = (lora_b if plan.slots is None else lora_b[plan.slots]).float()
        mid = torch.bmm(xs.reshape(count, plan.width, xs.shape[1]), a.transpose(1, 2))
        if plan.pad is not None:
            mid.masked_fill_(plan.pad, 0.0)
        return torch.bmm(mid, b.transpose(1, 2)).view(count * plan.width, -1)
    delta = torch.empty(xs.shape[0], lora_b.shape[1], dtype=torch.float32, device=xs.device)
    for slot, start, stop in plan.segments:
        mid = xs[start:stop] @ lora_a[slot].float().T
        torch.mm(mid, lora_b[slot].float().T, out=delta[start:stop])
    return delta


def lora_apply_segments(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor,
                        lora_b: torch.Tensor, segments: LoraSegments) -> torch.Tensor:
    """``y[t] += (x[t] @ lora_a[s].T) @ lora_b[s].T`` for every row ``t`` of slot ``s`` in
    ``segments``; in place, returns ``y`` (arguments checked by the caller)."""
    f32 = torch.float32
    wide = y.dtype == f32 and x.dtype == f32 and lora_a.dtype == f32 and lora_b.dtype == f32
    plan = segments.plan(lora_a.shape[0], x.device, runs=wide)
    for slot, start, stop in plan.runs:
        y[start:stop].addmm_(x[start:stop] @ lora_a[slot].T, lora_b[slot].T)
    if not plan.segments:
        return y
    xs = (x if plan.rows is None else x.index_select(0, plan.rows)).float()
    delta = _delta(xs, lora_a, lora_b, plan)
    target = y if y.dtype == torch.float32 else y.float()  # one rounding of the sum
    if plan.rows is None:
        target.add_(delta)
    else:
        target.index_add_(0, plan.rows, delta)
    return y if target is y else y.copy_(target)
