"""Give a module built on the ``meta`` device real storage, cheaply."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def allocate(module: ModuleT, device: torch.device, dtype: torch.dtype) -> ModuleT:
    """Replace every parameter and buffer of ``module`` (built on ``meta``) with
    uninitialised storage on ``device``: floating tensors in ``dtype``, others as they are.

    Same result as ``module.to_empty(device=device).to(dtype)``, but ``to_empty`` calls
    ``empty_like`` on meta tensors, whose first call imports torch's symbolic-shape
    machinery (sympy): ~0.6 s of every worker start. ``torch.empty`` from the shape does
    not, and allocating in ``dtype`` at once skips a float32 copy of the whole model.
    """

    def fresh(tensor: torch.Tensor) -> torch.Tensor:
        kind = dtype if tensor.is_floating_point() else tensor.dtype
        return torch.empty(tensor.shape, dtype=kind, device=device)

    return module._apply(fresh)
