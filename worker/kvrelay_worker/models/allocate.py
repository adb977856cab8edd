"""Give a module built on the ``meta`` device real storage, cheaply."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def allocate(module: ModuleT, device: torch.device, dtype: torch.dtype) -> ModuleT:
    """Replace every parameter and buffer of ``module`` (built on ``meta``) with
    uninitialised storage on ``device``: floating tensors in ``dtype``, others as they are.

    Same result as ``module.to_empty(device=device).to(dtype)``, without its costs:
    ``to_empty`` allocates every floating tensor in float32 before ``.to`` converts it, so
    a bfloat16 model briefly needs three times its size in memory; and it calls
    ``empty_like`` on meta tensors, whose first call imports torch's symbolic-shape
    machinery (sympy, ~0.6 s; a worker still pays it today through transformers' import
    for the tokenizer).
    """

    def fresh(tensor: torch.Tensor) -> torch.Tensor:
        kind = dtype if tensor.is_floating_point() else tensor.dtype
        return torch.empty(tensor.shape, dtype=kind, device=device)

    return module._apply(fresh)
