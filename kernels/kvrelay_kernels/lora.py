"""Public entry point of batched LoRA: many adapters over one base linear, one per row.

Every row of a step's batch may use a different adapter slot, or none (-1). The caller
stacks its adapters: ``lora_a`` ``[S, R, in]`` (ranks zero-padded to R) and ``lora_b``
``[S, out, R]`` with each adapter's scaling folded in; fused projections (q|k|v,
gate|up) are block-structured A/B, so nothing here knows of them.

CUDA tensors take the Triton shrink/expand kernels over segments of rows grouped by slot;
CPU tensors take the reference (one pair of matmuls per adapter present in the batch),
or, given the step's ``LoraSegments`` (rows grouped by slot once for every call of the
step), batched matmuls over those segments (``reference/lora_segments.py``).
``KVRELAY_KERNELS`` overrides the choice as for every kernel (``backend.py``).
"""

from __future__ import annotations

import torch

from kvrelay_kernels.backend import select_backend
from kvrelay_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelArgumentError,
    check_contiguous,
    check_dims,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
)
from kvrelay_kernels.reference.lora import lora_apply_reference
from kvrelay_kernels.reference.lora_segments import LoraSegments, lora_apply_segments

# The widest padded rank the Triton kernels are planned for (one program holds a
# [rows, R] float32 tile of the intermediate); PEFT adapters are rank 8 to 64.
MAX_LORA_RANK = 128


def check_lora_args(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor,
                    lora_b: torch.Tensor, row_slots: torch.Tensor) -> None:
    """Shapes, dtypes, devices and layouts of one ``lora_apply`` call (no device values)."""
    check_dims("x", x, 2)
    check_dims("y", y, 2)
    check_dims("lora_a", lora_a, 3)
    check_dims("lora_b", lora_b, 3)
    check_dims("row_slots", row_slots, 1)
    for name, tensor in (("x", x), ("y", y), ("lora_a", lora_a), ("lora_b", lora_b)):
        check_dtype(name, tensor, FLOAT_DTYPES)
    check_dtype("row_slots", row_slots, INDEX_DTYPES)
    check_same_device(y=y, x=x, lora_a=lora_a, lora_b=lora_b, row_slots=row_slots)
    rows, in_features = x.shape
    slots, rank = lora_a.shape[0], lora_a.shape[1]
    out_features = y.shape[1]
    check_shape("y", y, (rows, None))
    check_shape("lora_a", lora_a, (None, None, in_features))
    check_shape("lora_b", lora_b, (slots, out_features, rank))
    check_shape("row_slots", row_slots, (rows,))
    if rank > MAX_LORA_RANK:
        raise KernelArgumentError(
            f"lora_a's rank dimension is {rank}, over the supported {MAX_LORA_RANK}")
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("y", y)
    check_contiguous("lora_a", lora_a)
    check_contiguous("lora_b", lora_b)


def check_slot_range(row_slots: torch.Tensor, num_slots: int) -> None:
    """Every slot is -1 or names one of the ``num_slots`` adapters.

    Reads the slots back (one synchronisation on a GPU), hence skipped while a CUDA graph
    is being captured; the kernels skip an out-of-range row rather than read past the
    stack, so an unchecked bad slot leaves its row unchanged.
    """
    if row_slots.numel() == 0:
        return
    low, high = (int(v) for v in torch.stack(torch.aminmax(row_slots)).tolist())
    if low < -1 or high >= num_slots:
        bad = low if low < -1 else high
        raise KernelArgumentError(
            f"row_slots must be -1 (no adapter) or a slot in [0, {num_slots}), got {bad}")


def lora_apply(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
               row_slots: torch.Tensor, *, slots_checked: bool = False,
               segments: LoraSegments | None = None) -> torch.Tensor:
    """``y[t] += (x[t] @ lora_a[s].T) @ lora_b[s].T`` for each row ``t`` whose slot ``s =
    row_slots[t]`` is not -1, accumulated in float32; in place, returns ``y``.

    - ``x`` ``[T, in]``, ``y`` ``[T, out]`` (the base linear's output), any float dtypes;
      rows may be strided, the last dimension must be contiguous.
    - ``lora_a`` ``[S, R, in]``, ``lora_b`` ``[S, out, R]``: contiguous stacks, ranks
      zero-padded to R, scaling folded into B.
    - ``row_slots`` ``[T]`` int32/int64, -1 for "no adapter".

    ``slots_checked``: the caller has checked the slots' range already (the engine does
    once per step, on the host), so this call does not read them back from the device.
    ``segments``: ``row_slots`` grouped on the host (the same slots), shared by the step's
    calls; the CPU path then skips its per-call grouping (the Triton kernels ignore it).
    """
    check_lora_args(y, x, lora_a, lora_b, row_slots)
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not slots_checked and not capturing:
        check_slot_range(row_slots, lora_a.shape[0])
    if x.shape[0] == 0 or lora_a.shape[0] == 0 or lora_a.shape[1] == 0:
        return y
    if select_backend(x.device) == "triton":
        from kvrelay_kernels.triton_kernels.lora import lora_apply_triton

        return lora_apply_triton(y, x, lora_a, lora_b, row_slots)
    if segments is not None:
        if segments.host_slots.shape[0] != x.shape[0]:
            raise KernelArgumentError(
                f"segments describe {segments.host_slots.shape[0]} rows, x has {x.shape[0]}")
        return lora_apply_segments(y, x, lora_a, lora_b, segments)
    return lora_apply_reference(y, x, lora_a, lora_b, row_slots)
