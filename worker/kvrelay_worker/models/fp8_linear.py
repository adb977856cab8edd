"""Linear layers whose weights stay FP8 (float8_e4m3fn) as a checkpoint stored them.

One byte per weight in memory, a float32 scale per channel (or per 128-input group of a
block-quantized checkpoint). The product is ``kvrelay_kernels.fp8_matmul``: FP8 matmuls
on GPUs that have them, kernels that convert FP8 to float in their loops elsewhere.

The bytes are held as a uint8 buffer and viewed as float8_e4m3fn (free) when multiplied:
``Module.to(dtype)`` casts every floating-point tensor, and float8 counts as one, so a
float8 buffer would be turned into a float copy of the matrix by a dtype cast of the
model; uint8 is left alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kvrelay_kernels.fp8_matmul import fp8_matmul
from kvrelay_kernels.fp8_weight import FP8_DTYPE, Fp8Weight


class Fp8Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in FP8; a drop-in for ``nn.Linear`` at inference."""

    fp8_bytes: torch.Tensor
    scales: torch.Tensor
    input_scale: torch.Tensor | None

    def __init__(self, weight: Fp8Weight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight.check()
        self.group_size = weight.group_size
        self.activations = weight.activations
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        self.register_buffer("fp8_bytes", weight.weight.view(torch.uint8))
        self.register_buffer("scales", weight.scales)
        self.register_buffer("input_scale", weight.input_scale)
        # A parameter, as in nn.Linear, so checkpoint loading fills q/k/v bias shards alike.
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def fp8(self) -> Fp8Weight:
        """The weight as one checked ``Fp8Weight``, built once (a decode step calls every
        layer); moving the module or replacing a tensor drops it."""
        cached: Fp8Weight | None = self.__dict__.get("_fp8")
        if cached is None:
            cached = Fp8Weight(self.fp8_bytes.view(FP8_DTYPE), self.scales, self.group_size,
                               self.activations, self.input_scale)
            cached.check()
            self.__dict__["_fp8"] = cached
        return cached

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("fp8_bytes", "scales", "input_scale"):
            self.__dict__.pop("_fp8", None)
        super().__setattr__(name, value)

    def _apply(self, fn: Any, recurse: bool = True) -> Fp8Linear:
        self.__dict__.pop("_fp8", None)
        return super()._apply(fn, recurse)

    @property
    def weight_bytes(self) -> int:
        return self.fp8.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_matmul(x, self.fp8, self.bias, weight_checked=True)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"fp8 e4m3, group_size={self.group_size}, activations={self.activations}, "
                f"bias={self.bias is not None}")
