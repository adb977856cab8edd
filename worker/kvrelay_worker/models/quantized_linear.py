"""Linear layers and embeddings whose weights are stored quantized (int8 or int4).

Decode at batch 1 reads every weight byte once per token, so fewer bytes per weight is
speed as well as memory. Activations stay in the model's dtype; the matmul
(``kvrelay_kernels.quantized_matmul``) dequantizes inside its loop. The layout is
``kvrelay_kernels.quantized_weight``'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight


class QuantizedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` quantized; a drop-in for ``nn.Linear`` at inference."""

    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        weight.check()
        self.bits = weight.bits
        self.group_size = weight.group_size
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("mins", weight.mins)
        # A parameter, as in nn.Linear, so checkpoint loading fills q/k/v bias shards alike.
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def quantized(self) -> QuantizedWeight:
        """The weight as one checked ``QuantizedWeight``, built once: a decode step calls
        every layer, and rebuilding and re-checking it each time cost more than the
        product of a small layer. Moving the module or replacing a tensor drops it."""
        cached: QuantizedWeight | None = self.__dict__.get("_quantized")
        if cached is None:
            cached = QuantizedWeight(self.qweight, self.scales, self.mins, self.bits,
                                     self.group_size, self.in_features)
            cached.check()
            self.__dict__["_quantized"] = cached
        return cached

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("qweight", "scales", "mins"):
            self.__dict__.pop("_quantized", None)
        super().__setattr__(name, value)

    def _apply(self, fn: Any, recurse: bool = True) -> QuantizedLinear:
        self.__dict__.pop("_quantized", None)
        return super()._apply(fn, recurse)

    @property
    def weight_bytes(self) -> int:
        return self.quantized.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_matmul(x, self.quantized, self.bias, weight_checked=True)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, group_size={self.group_size}, bias={self.bias is not None}")


class QuantizedEmbedding(nn.Module):
    """Token embeddings read from a quantized table: only the looked-up rows are dequantized.

    With tied embeddings the table is the LM head's own ``QuantizedLinear`` (its rows are
    the vocabulary), so the bytes are stored once.
    """

    def __init__(self, table: QuantizedLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = table
        self.dtype = dtype
        self.num_embeddings = table.out_features
        self.embedding_dim = table.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dequantize_weight(self.table.quantized.rows(ids.reshape(-1)))
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)
