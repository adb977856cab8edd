"""Linear layers and embeddings whose weights are stored quantized (int8 or int4).

Decode at batch 1 reads every weight byte once per token, so fewer bytes per weight is
speed as well as memory. Activations stay in the model's dtype; the matmul
(``kvrelay_kernels.quantized_matmul``) dequantizes inside its loop. The layout is
``kvrelay_kernels.quantized_weight``'s.

A fused projection (q|k|v, gate|up) is one ``QuantizedLinear`` when its shards share a
layout. A GGUF may store them in different types (a ``Q4_K_M`` file's Q6_K ``attn_v``
beside Q4_K ``attn_q``/``attn_k``): ``FusedQuantizedLinear`` keeps each run of same-layout
shards as its own matrix and joins their products column-wise.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
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


class FusedQuantizedLinear(nn.Module):
    """A fused projection whose shards are kept in different layouts: each part's product
    goes through ``quantized_matmul`` on its own kept weight (the same door, hence the
    same CPU and Triton kernels, as ``QuantizedLinear``) and the outputs are joined along
    the columns, in shard order. No float weight, no concatenation of weights per call;
    the cost over one matrix is a kernel call per part and the copy of the outputs.

    ``parts`` are the row blocks of the fused matrix, top to bottom (q|k then v: two
    parts), each a bias-less ``QuantizedLinear``; ``bias`` spans every output column (a
    parameter, as in ``nn.Linear``, so checkpoint loading fills its shards) and each part
    adds its slice.
    """

    def __init__(self, parts: Sequence[QuantizedWeight],
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if len(parts) < 2:
            raise ValueError("a fused quantized linear needs two parts or more")
        in_features = parts[0].in_features
        if any(part.in_features != in_features for part in parts):
            raise ValueError("the parts of a fused linear must share in_features, got "
                             f"{[part.in_features for part in parts]}")
        linears = [QuantizedLinear(part) for part in parts]
        self.parts = nn.ModuleList(linears)
        self.in_features = in_features
        self.out_features = sum(part.out_features for part in parts)
        stops = list(accumulate(part.out_features for part in parts))
        self.columns: list[tuple[int, int]] = list(zip([0, *stops[:-1]], stops, strict=True))
        # The same modules, typed (moving the model changes their tensors, not them).
        self._blocks = list(zip(linears, self.columns, strict=True))
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"bias must have shape {(self.out_features,)}, got "
                             f"{tuple(bias.shape)}")
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def weight_bytes(self) -> int:
        return sum(part.weight_bytes for part, _ in self._blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        outputs = [quantized_matmul(x, part.quantized,
                                    None if bias is None else bias[start:stop],
                                    weight_checked=True)
                   for part, (start, stop) in self._blocks]
        return torch.cat(outputs, dim=-1)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns={self.columns}, bias={self.bias is not None}")


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
