"""Kernel tests run the Triton kernels for real: compiled on a GPU, interpreted on a CPU.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is defined, hence at
import time of this conftest, ahead of the test modules.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    """Where the Triton kernels run: the GPU when there is one, else the interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
