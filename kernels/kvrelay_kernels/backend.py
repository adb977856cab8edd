"""Choose between the Triton kernels and the plain-PyTorch references.

Triton runs where the tensors are on a CUDA device and Triton imports; everything else
takes the reference path, except CPU paged attention, which runs a C++ kernel compiled
on first use where a compiler is present (``cpu_kernels/``).
``KVRELAY_KERNELS=reference`` forces the references everywhere (useful to bisect a
numerical difference, and how tests exercise the fallback of a machine without a
compiler); ``KVRELAY_KERNELS=triton`` forces Triton, which on CPU tensors only works under
``TRITON_INTERPRET=1`` (how CI tests the kernels).
"""

from __future__ import annotations

import functools
import os
from typing import Literal

import torch

Backend = Literal["triton", "reference"]


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _forced() -> str:
    return os.environ.get("KVRELAY_KERNELS", "").strip().lower()


def cpu_kernels_allowed() -> bool:
    """Whether CPU calls may use the compiled C++ kernels (``KVRELAY_KERNELS`` is auto)."""
    return _forced() not in ("reference", "triton")


def cpu_float32_kernel(*tensors: torch.Tensor) -> bool:
    """Whether the C++ CPU kernels take a call on these tensors: all float32 on the CPU,
    kernels allowed and built (the elementwise kernels are float32 only; other dtypes
    take the reference)."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return False
    if not cpu_kernels_allowed():
        return False
    from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels

    return load_cpu_kernels()


def select_backend(device: torch.device) -> Backend:
    forced = _forced()
    if forced == "reference":
        return "reference"
    if forced == "triton":
        return "triton"
    if device.type == "cuda" and triton_available():
        return "triton"
    return "reference"
