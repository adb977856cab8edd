"""Repack GGUF's quantized blocks into the engine's layout, losslessly where they map.

A GGUF row of ``K`` inputs is ``K / 32`` blocks, or ``K / 256`` super-blocks for the
K-quants (llama.cpp's ``ggml-common.h``; the ``gguf`` package's ``gguf.quants`` decodes the
same layouts). Every type below is kept as stored: its integers move unchanged into our
layout (``kvrelay_kernels.quantized_weight``) and its scales are kept (float16) or are the
exact float32 products of its super-block scale and 6- or 8-bit sub-scale, so that
dequantising our copy (``q * scale + min`` in float32) gives ``gguf.quants.dequantize``'s
bits:

- Q8_0, 34 bytes: ``d`` (float16), 32 int8 ``q``; ``w = d * q`` -> int8, group 32, scale d.
- Q4_0, 18 bytes: ``d`` (float16), 16 bytes of nibbles; ``w = d * (q - 8)`` -> int4, group 32,
  scale d, minimum ``-8 d`` (exact in float16: a power-of-two multiple).
- Q4_1, 20 bytes: ``d``, ``m`` (float16), 16 bytes of nibbles; ``w = d * q + m`` -> int4,
  group 32, scale d, minimum m.
- Q5_0, 22 bytes: ``d`` (float16), ``qh`` (4 bytes: bit j is input j's fifth bit), 16 bytes
  of nibbles; ``w = d * (q - 16)`` -> int8 (-16..15), group 32, scale d.
- Q5_1, 24 bytes: ``d``, ``m`` (float16), ``qh``, nibbles; ``w = d * q + m`` -> int8 with
  minimums (q in 0..31), group 32, scale d, minimum m.
- Q4_K, 144 bytes per 256 inputs: ``d``, ``dmin`` (float16), 12 bytes of 6-bit sub-scales
  ``sc`` and sub-minimums ``m`` for 8 sub-blocks of 32, 128 bytes of nibbles;
  ``w = d * sc * q - dmin * m`` -> int4, group 32, float32 scale ``d * sc`` and minimum
  ``-(dmin * m)`` (a float16 times a 6-bit integer: exact in float32).
- Q5_K, 176 bytes: as Q4_K plus 32 bytes ``qh`` (bit i of byte j: the fifth bit of input
  j of sub-block i) -> int8 with minimums (q in 0..31), group 32, float32 scales/minimums.
- Q6_K, 210 bytes: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 sub-scales
  (one per 16 inputs), ``d`` (float16); ``w = d * sc * (q - 32)`` -> int8 (-32..31), group 16,
  float32 scale ``d * sc`` (an 11-bit times an 8-bit integer: exact).

Nibble order: in Q4_0/Q4_1/Q5_x blocks byte ``j`` holds input ``j`` (low nibble) and
``j + 16`` (high); in a Q4_K/Q5_K super-block each 32 bytes hold two sub-blocks (low
nibbles the first, high the second); Q6_K's 64-byte halves hold four 32-input quarters
(low nibbles of bytes 0..63, then their high nibbles). Our int4 is packed by row halves.

Other types (Q2_K, Q3_K, the IQ types, ...) have no lossless counterpart here:
``repack_blocks`` returns None and the caller dequantises and requantizes them
(``requantize``), which ``kvrelay models`` and the load log report.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from kvrelay_kernels.quantized_weight import (
    QuantizedWeight,
    pack_int4,
    quantize_int4,
    quantize_int8,
)

BLOCK = 32
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class KeptLayout:
    """The engine layout a GGUF type is repacked into (what ``kvrelay models`` counts)."""

    bits: int
    group_size: int
    scale_bytes: int  # 2: float16, 4: float32
    mins: bool


KEPT_LAYOUTS = {
    "Q8_0": KeptLayout(8, 32, 2, False),
    "Q4_0": KeptLayout(4, 32, 2, True),
    "Q4_1": KeptLayout(4, 32, 2, True),
    "Q5_0": KeptLayout(8, 32, 2, False),
    "Q5_1": KeptLayout(8, 32, 2, True),
    "Q4_K": KeptLayout(4, 32, 4, True),
    "Q5_K": KeptLayout(8, 32, 4, True),
    "Q6_K": KeptLayout(8, 16, 4, False),
}
LOSSLESS_TYPES = tuple(KEPT_LAYOUTS)
# Types requantized from float: at most this many bits per weight become int4, others int8.
FOUR_BIT_TYPES = ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS",
                  "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")


def kept_bytes(name: str, numel: int) -> int:
    """Resident bytes of ``numel`` weights of a lossless type once repacked."""
    layout = KEPT_LAYOUTS[name]
    per_group = layout.scale_bytes * (2 if layout.mins else 1)
    return numel * layout.bits // 8 + numel // layout.group_size * per_group


def _half(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 field at byte ``start`` of every block, as float32 ``[rows, blocks]``."""
    return np.ascontiguousarray(raw[..., start:start + 2]).view(np.float16)[..., 0].astype(
        np.float32)


def _low_high(nibbles: np.ndarray) -> np.ndarray:
    """``[..., c]`` bytes -> ``[..., 2, c]`` values: the low nibbles, then the high ones."""
    return np.stack((nibbles & 15, nibbles >> 4), axis=-2)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit sub-scales and 8 sub-minimums (``get_scale_min_k4``:
    bytes 0-3 and 4-7 hold the low 6 bits of sub-blocks 0-3; sub-blocks 4-7 take their low
    4 bits from bytes 8-11 and their top 2 from the spare bits of bytes 0-7)."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate((d & 63, (md & 15) | ((d >> 6) << 4)), axis=-1)
    mins = np.concatenate((m & 63, (md >> 4) | ((m >> 6) << 4)), axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _legacy_fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4 bytes per block -> ``[..., 32]`` bits (bit j of the little-endian word)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _weight(q: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, bits: int, group: int,
            in_features: int) -> QuantizedWeight:
    rows = q.shape[0]
    values = torch.from_numpy(np.ascontiguousarray(q.reshape(rows, in_features)))
    qweight = pack_int4(values) if bits == 4 else values.view(torch.int8).contiguous()
    scale_t = torch.from_numpy(np.ascontiguousarray(scales.reshape(rows, -1)))
    min_t = None if mins is None else torch.from_numpy(np.ascontiguousarray(
        mins.reshape(rows, -1)))
    return QuantizedWeight(qweight, scale_t, min_t, bits, group, in_features)


def _repack_legacy(raw: np.ndarray, name: str, in_features: int) -> QuantizedWeight:
    """Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: ``raw`` is ``[rows, blocks, bytes per block]``."""
    rows = raw.shape[0]
    d = np.ascontiguousarray(raw[..., 0:2]).view(np.float16)[..., 0]
    if name == "Q8_0":
        return _weight(raw[..., 2:].view(np.int8), d, None, 8, BLOCK, in_features)
    if name == "Q4_0":
        mins = (d.astype(np.float32) * -8.0).astype(np.float16)
        if not np.isfinite(mins).all():  # a scale above 8188 overflows float16
            return _weight(_low_high(raw[..., 2:]).astype(np.uint8), d.astype(np.float32),
                           d.astype(np.float32) * -8.0, 4, BLOCK, in_features)
        return _weight(_low_high(raw[..., 2:]), d, mins, 4, BLOCK, in_features)
    if name == "Q4_1":
        m = np.ascontiguousarray(raw[..., 2:4]).view(np.float16)[..., 0]
        return _weight(_low_high(raw[..., 4:]), d, m, 4, BLOCK, in_features)
    offset = 2 if name == "Q5_0" else 4
    fifth = _legacy_fifth_bits(raw[..., offset:offset + 4])
    q = _low_high(raw[..., offset + 4:]).reshape(rows, -1, BLOCK) | (fifth << 4)
    if name == "Q5_0":
        return _weight((q.astype(np.int8) - 16), d, None, 8, BLOCK, in_features)
    m = np.ascontiguousarray(raw[..., 2:4]).view(np.float16)[..., 0]
    return _weight(q.astype(np.int8), d, m, 8, BLOCK, in_features)


def _repack_k(raw: np.ndarray, name: str, in_features: int) -> QuantizedWeight:
    """Q4_K, Q5_K, Q6_K: ``raw`` is ``[rows, super-blocks, bytes per super-block]``."""
    rows, supers = raw.shape[:2]
    if name == "Q6_K":
        low = raw[..., 0:128].reshape(rows, supers, 2, 64)  # two halves of 128 inputs
        high = raw[..., 128:192].reshape(rows, supers, 2, 1, 32)
        sub_scales = raw[..., 192:208].view(np.int8).astype(np.float32)
        d = _half(raw, 208)
        low_values = _low_high(low)  # [rows, supers, half, nibble, 64]: 4 quarters of 32
        pairs = (high >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
        q = (low_values.reshape(rows, supers, 2, 4, 32) | (pairs << 4)).astype(np.int8) - 32
        return _weight(q, d[..., None] * sub_scales, None, 8, 16, in_features)
    d, dmin = _half(raw, 0), _half(raw, 2)
    sub_scales, sub_mins = _k_scales(raw[..., 4:16])
    scales = d[..., None] * sub_scales
    mins = -(dmin[..., None] * sub_mins)
    if name == "Q4_K":
        q = _low_high(raw[..., 16:144].reshape(rows, supers, 4, 32))  # sub-blocks 2j, 2j + 1
        return _weight(q, scales, mins, 4, BLOCK, in_features)
    high = raw[..., 16:48].reshape(rows, supers, 1, 32)
    fifth = (high >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1  # [.., sub-block, 32]
    low = _low_high(raw[..., 48:176].reshape(rows, supers, 4, 32)).reshape(rows, supers, 8, 32)
    return _weight((low | (fifth << 4)).astype(np.int8), scales, mins, 8, BLOCK, in_features)


def repack_blocks(data: np.ndarray, kind: GGMLQuantizationType,
                  in_features: int) -> QuantizedWeight | None:
    """``data``: the reader's ``[rows, bytes per row]`` uint8 view of one 2-D tensor; None
    for a type without a lossless repack."""
    name = kind.name
    if name not in KEPT_LAYOUTS:
        return None
    block, size = GGML_QUANT_SIZES[kind]
    rows = data.shape[0]
    # a copy: the reader's arrays are read-only views of the memory map
    raw = np.array(data, dtype=np.uint8).reshape(rows, in_features // block, size)
    if block == BLOCK:
        return _repack_legacy(raw, name, in_features)
    return _repack_k(raw, name, in_features)


def requantize(weight: torch.Tensor, kind: GGMLQuantizationType) -> QuantizedWeight:
    """A GGUF type without a lossless repack, from its dequantised float32 values.

    Four-bit-or-less types become int4 in groups of 32, the others int8 per output
    channel: a second rounding, so not bit-exact with the file (``kvrelay models`` and
    the load log say so).
    """
    if kind.name in FOUR_BIT_TYPES:
        return quantize_int4(weight, BLOCK)
    return quantize_int8(weight)
