"""Argument checks shared by every public kernel wrapper.

A kernel launched on a tensor of the wrong shape or stride reads garbage or
faults the device; these checks turn that into a clear ``KernelArgumentError``
raised before launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


class KernelArgumentError(ValueError):
    """A tensor handed to a kernel has the wrong shape, dtype, device or layout."""


def check_dims(name: str, tensor: torch.Tensor, ndim: int) -> None:
    if tensor.dim() != ndim:
        raise KernelArgumentError(
            f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}"
        )


def check_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise KernelArgumentError(f"{name} must be one of {names}, got {tensor.dtype}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise KernelArgumentError(f"all tensors must be on one device: {listing}")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n} is {d}" for n, d in dtypes.items())
        raise KernelArgumentError(f"tensors must share one dtype: {listing}")


def check_last_dim_contiguous(name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() > 0 and tensor.stride(-1) != 1:
        raise KernelArgumentError(
            f"{name} must be contiguous in its last dimension, got strides {tensor.stride()}"
        )


def check_contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise KernelArgumentError(f"{name} must be contiguous, got strides {tensor.stride()}")


def check_shape(name: str, tensor: torch.Tensor, expected: Sequence[int | None]) -> None:
    """Check ``tensor.shape`` against ``expected``; ``None`` matches any size."""
    shape = tuple(tensor.shape)
    ok = len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected, strict=True)
    )
    if not ok:
        pretty = tuple("*" if e is None else e for e in expected)
        raise KernelArgumentError(f"{name} must have shape {pretty}, got {shape}")
