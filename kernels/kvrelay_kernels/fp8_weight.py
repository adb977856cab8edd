"""The engine's layout of FP8 weights: the float8_e4m3fn bytes as stored, float32 scales.

A compressed-tensors FP8 checkpoint (llmcompressor's ``FP8_DYNAMIC``, ``FP8``,
``FP8_BLOCK``) stores each linear layer's weight as float8_e4m3fn ``q`` with
``w = float(q) * scale``. The engine keeps those bytes (1 byte per weight) and never
writes a float copy of the matrix: the products (``fp8_matmul``) convert FP8 to float
inside their loops, or run FP8 matmuls on GPUs that have them.

Scales are float32 ``[N, ceil(K / group_size)]``, one per output channel and group of
inputs; the last group of a row may be partial. Per channel is ``group_size == K``; a
per-tensor scale is spread over the channels (so shards of a fused q/k/v with different
tensor scales stay exact); 128x128 blocks are ``group_size == 128`` with each block's
scale repeated over its rows.

``input_scale`` is the checkpoint's static activation scale (``FP8``), ``None`` when
activations are quantized per token at run time (``FP8_DYNAMIC``) or not at all; only the
FP8-matmul path uses it (``activations`` says which). The float paths are weight-only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrelay_kernels.checks import KernelArgumentError

FP8_DTYPE = torch.float8_e4m3fn
# The largest finite float8_e4m3fn value: activations are scaled into [-448, 448].
FP8_MAX = 448.0
# How the checkpoint quantizes activations: per token at run time, one static scale, none.
ACTIVATIONS = ("dynamic", "static", "none")


@dataclass(frozen=True)
class Fp8Weight:
    """An FP8 ``[out_features, in_features]`` matrix (see the module docstring)."""

    weight: torch.Tensor
    scales: torch.Tensor
    group_size: int
    activations: str = "none"
    input_scale: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def per_channel(self) -> bool:
        """One scale per output channel (what the FP8 matmuls take)."""
        return self.group_size >= self.in_features

    @property
    def nbytes(self) -> int:
        """Bytes resident in memory (FP8 values, scales, the static activation scale)."""
        tensors = [self.weight, self.scales]
        if self.input_scale is not None:
            tensors.append(self.input_scale)
        return sum(t.numel() * t.element_size() for t in tensors)

    def check(self) -> None:
        """Raise ``KernelArgumentError`` unless the tensors match the layout."""
        w = self.weight
        if w.dtype != FP8_DTYPE or w.dim() != 2 or not w.is_contiguous():
            raise KernelArgumentError(f"weight must be a contiguous 2-D {FP8_DTYPE}, got "
                                      f"{w.dtype} {tuple(w.shape)}")
        n, k, g = self.out_features, self.in_features, self.group_size
        if g < 1:
            raise KernelArgumentError(f"group_size must be positive, got {g}")
        groups = -(-k // g)
        if (self.scales.dtype != torch.float32 or tuple(self.scales.shape) != (n, groups)
                or not self.scales.is_contiguous()):
            raise KernelArgumentError(f"scales must be contiguous float32 {(n, groups)}, got "
                                      f"{self.scales.dtype} {tuple(self.scales.shape)}")
        if self.scales.device != w.device:
            raise KernelArgumentError(f"scales are on {self.scales.device}, weight on "
                                      f"{w.device}")
        if self.activations not in ACTIVATIONS:
            raise KernelArgumentError(f"activations must be one of {ACTIVATIONS}, got "
                                      f"{self.activations!r}")
        static = self.activations == "static"
        if static != (self.input_scale is not None):
            raise KernelArgumentError("a static activation scheme needs input_scale, and "
                                      "only it")
        if self.input_scale is not None and (self.input_scale.numel() != 1
                                             or self.input_scale.dtype != torch.float32
                                             or self.input_scale.device != w.device):
            raise KernelArgumentError("input_scale must be one float32 value on the weight's "
                                      "device")

    def to(self, device: torch.device) -> Fp8Weight:
        scale = None if self.input_scale is None else self.input_scale.to(device)
        return Fp8Weight(self.weight.to(device), self.scales.to(device), self.group_size,
                         self.activations, scale)


def spread_scales(scales: torch.Tensor, group: int, in_features: int) -> torch.Tensor:
    """``[N, groups]`` scales -> one float32 value per weight ``[N, K]`` (references, tests)."""
    return scales.float().repeat_interleave(group, dim=1)[:, :in_features]
