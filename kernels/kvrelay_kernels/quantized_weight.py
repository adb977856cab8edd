"""The engine's layout of weight-only quantized matrices, and quantizing float weights into it.

One ``[out_features, in_features]`` matrix is cut, along each row, into groups of
``group_size`` inputs; each group has one scale (and, for 4 bits, one minimum):

- ``bits=8``: ``qweight`` int8 ``[N, K]``, ``w = q * scale`` (symmetric), or, with
  ``mins``, ``w = q * scale + min`` (asymmetric: GGUF's Q5_1 and Q5_K, ``q`` in 0..31).
  Per output channel is the case ``group_size == K``; GGUF's Q8_0 is ``group_size == 32``,
  its Q6_K ``group_size == 16``.
- ``bits=4``: ``qweight`` uint8 ``[N, K // 2]``, ``w = q * scale + min`` with ``q`` in 0..15.
  Byte ``c`` of a row holds input ``c`` in its low nibble and input ``K/2 + c`` in its high
  nibble: the two halves of the row are read with the same contiguous loads, so one mask
  and one shift of a 32-byte load unpack two blocks of 32 weights (the CPU kernels).

``scales`` and ``mins`` are ``[N, K // group_size]``, float16 or float32 (GGUF's fp16 block
scales stay fp16, so their repack is lossless; a K-quant's ``d * sub-scale`` products are
float32, which holds them exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrelay_kernels.checks import KernelArgumentError

QUANT_BITS = (4, 8)
SCALE_DTYPES = (torch.float16, torch.float32)


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized ``[out_features, in_features]`` matrix (see the module docstring)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    bits: int
    group_size: int
    in_features: int

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes resident in memory (packed values, scales, minimums)."""
        tensors = [self.qweight, self.scales] + ([self.mins] if self.mins is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def check(self) -> None:
        """Raise ``KernelArgumentError`` unless the tensors match the layout."""
        n, k, g = self.out_features, self.in_features, self.group_size
        if self.bits not in QUANT_BITS:
            raise KernelArgumentError(f"bits must be 4 or 8, got {self.bits}")
        if g < 1 or k % g:
            raise KernelArgumentError(f"group_size {g} must divide in_features {k}")
        packed = k if self.bits == 8 else k // 2
        dtype = torch.int8 if self.bits == 8 else torch.uint8
        if self.bits == 4 and k % 2:
            raise KernelArgumentError(f"int4 needs an even in_features, got {k}")
        if self.qweight.dtype != dtype or tuple(self.qweight.shape) != (n, packed):
            raise KernelArgumentError(
                f"qweight must be {dtype} of shape {(n, packed)}, got {self.qweight.dtype} "
                f"{tuple(self.qweight.shape)}"
            )
        groups = [("scales", self.scales)]
        if self.bits == 4 and self.mins is None:
            raise KernelArgumentError("int4 weights need mins")
        if self.mins is not None:
            groups.append(("mins", self.mins))
            if self.mins.dtype != self.scales.dtype:
                raise KernelArgumentError(f"mins ({self.mins.dtype}) must have the scales' "
                                          f"dtype ({self.scales.dtype})")
        for name, t in groups:
            if t.dtype not in SCALE_DTYPES or tuple(t.shape) != (n, k // g):
                raise KernelArgumentError(
                    f"{name} must be float16/float32 of shape {(n, k // g)}, got {t.dtype} "
                    f"{tuple(t.shape)}"
                )
            if t.device != self.qweight.device:
                raise KernelArgumentError(f"{name} is on {t.device}, qweight on "
                                          f"{self.qweight.device}")
        if not self.qweight.is_contiguous():
            raise KernelArgumentError("qweight must be contiguous")

    def to(self, device: torch.device) -> QuantizedWeight:
        mins = None if self.mins is None else self.mins.to(device)
        return QuantizedWeight(self.qweight.to(device), self.scales.to(device), mins,
                               self.bits, self.group_size, self.in_features)

    def rows(self, index: torch.Tensor) -> QuantizedWeight:
        """The matrix of the chosen rows (output channels): an embedding lookup's rows."""
        mins = None if self.mins is None else self.mins[index]
        return QuantizedWeight(self.qweight[index], self.scales[index], mins, self.bits,
                               self.group_size, self.in_features)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K]`` values in 0..15 -> ``[N, K // 2]`` bytes (low: first half of the row)."""
    half = values.shape[-1] // 2
    low, high = values[..., :half], values[..., half:]
    return (low | (high << 4)).to(torch.uint8).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_int4``: ``[N, K // 2]`` bytes -> uint8 ``[N, K]`` in 0..15."""
    return torch.cat((packed & 15, packed >> 4), dim=-1)


def quantize_int8(weight: torch.Tensor, group_size: int | None = None) -> QuantizedWeight:
    """Symmetric int8, one float32 scale per output channel (or per group of inputs)."""
    n, k = weight.shape
    g = k if group_size is None else group_size
    if g < 1 or k % g:
        raise KernelArgumentError(f"group_size {g} must divide in_features {k}")
    grouped = weight.detach().float().reshape(n, k // g, g)
    scales = grouped.abs().amax(dim=-1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(grouped / scales[..., None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(q.reshape(n, k).contiguous(), scales.contiguous(), None, 8, g, k)


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> QuantizedWeight:
    """Asymmetric int4 per group: float16 ``scale`` and ``min`` with ``w ~ q * scale + min``.

    The scale is rounded to float16 before the values are quantized against it, so the
    stored scale is the one the values were computed with.
    """
    n, k = weight.shape
    if group_size < 1 or k % group_size or k % 2:
        raise KernelArgumentError(f"group_size {group_size} must divide in_features {k} "
                                  "(even for int4)")
    grouped = weight.detach().float().reshape(n, k // group_size, group_size)
    low = grouped.amin(dim=-1).half()
    high = grouped.amax(dim=-1)
    scales = ((high - low.float()) / 15.0).half()
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round((grouped - low.float()[..., None]) / scales.float()[..., None])
    values = q.clamp(0, 15).to(torch.uint8).reshape(n, k)
    return QuantizedWeight(pack_int4(values), scales.contiguous(), low.contiguous(), 4,
                           group_size, k)
