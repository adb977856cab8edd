"""Choose between the Triton kernels and the plain-PyTorch references.

Triton runs where the tensors are on a CUDA device and Triton imports; everything else
takes the reference path. ``KVRELAY_KERNELS=reference`` forces the references (useful to
bisect a numerical difference on a GPU); ``KVRELAY_KERNELS=triton`` forces Triton, which
on CPU tensors only works under ``TRITON_INTERPRET=1`` (how CI tests the kernels).
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


def select_backend(device: torch.device) -> Backend:
    forced = os.environ.get("KVRELAY_KERNELS", "").strip().lower()
    if forced == "reference":
        return "reference"
    if forced == "triton":
        return "triton"
    if device.type == "cuda" and triton_available():
        return "triton"
    return "reference"
