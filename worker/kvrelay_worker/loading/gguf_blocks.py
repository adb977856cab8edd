"""Repack GGUF's quantized blocks into the engine's layout, losslessly where they map.

A GGUF row of ``K`` inputs is ``K / 32`` blocks (llama.cpp's ``ggml-common.h``; the
``gguf`` package's ``gguf.quants`` decodes the same layouts):

- Q8_0, 34 bytes: ``d`` (float16), 32 int8 ``q``; ``w = d * q`` -> int8, group 32, scale d.
- Q4_0, 18 bytes: ``d`` (float16), 16 bytes of nibbles; ``w = d * (q - 8)`` -> int4, group 32,
  scale d, minimum ``-8 d`` (exact in float16: a power-of-two multiple).
- Q4_1, 20 bytes: ``d``, ``m`` (float16), 16 bytes of nibbles; ``w = d * q + m`` -> int4,
  group 32, scale d, minimum m.

Within a block, byte ``j`` holds input ``j`` in its low nibble and input ``j + 16`` in its
high nibble. The nibble values move, unchanged, into our row-halves packing, and the
float16 scales are kept, so dequantising our copy gives ``gguf.quants.dequantize``'s bits.
Other types (K-quants, Q5_x, ...) have no lossless counterpart here: ``repack_blocks``
returns None and the caller dequantises and requantizes them (``requantize``).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kvrelay_kernels.quantized_weight import (
    QuantizedWeight,
    pack_int4,
    quantize_int4,
    quantize_int8,
)

BLOCK = 32
LOSSLESS_TYPES = ("Q8_0", "Q4_0", "Q4_1")
FLOAT_TYPES = ("F32", "F16", "BF16")
# Types of at most this many bits per weight are requantized to int4, others to int8.
FOUR_BIT_TYPES = ("Q2_K", "Q3_K", "Q4_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS",
                   "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")


def repack_blocks(data: np.ndarray, kind: GGMLQuantizationType,
                  in_features: int) -> QuantizedWeight | None:
    """``data``: the reader's ``[rows, bytes per row]`` uint8 view of one 2-D tensor."""
    name = kind.name
    if name not in LOSSLESS_TYPES:
        return None
    rows = data.shape[0]
    blocks = in_features // BLOCK
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[name]
    # a writable copy: the reader's arrays are read-only views of the memory map
    raw = torch.from_numpy(np.array(data, dtype=np.uint8).reshape(rows, blocks, size))
    scales = raw[:, :, 0:2].contiguous().view(torch.float16).reshape(rows, blocks)
    if name == "Q8_0":
        q = raw[:, :, 2:].contiguous().view(torch.int8).reshape(rows, in_features)
        return QuantizedWeight(q.contiguous(), scales.contiguous(), None, 8, BLOCK, in_features)
    if name == "Q4_0":
        mins = (scales.float() * -8.0).half()
        if not torch.isfinite(mins).all():  # a scale above 8188 overflows float16
            mins_t: torch.Tensor = scales.float() * -8.0
            scales = scales.float()
        else:
            mins_t = mins
        nibbles = raw[:, :, 2:]
    else:
        mins_t = raw[:, :, 2:4].contiguous().view(torch.float16).reshape(rows, blocks)
        nibbles = raw[:, :, 4:]
    values = torch.cat((nibbles & 15, nibbles >> 4), dim=-1).reshape(rows, in_features)
    return QuantizedWeight(pack_int4(values), scales.contiguous(), mins_t.contiguous(), 4,
                           BLOCK, in_features)


def requantize(weight: torch.Tensor, kind: GGMLQuantizationType) -> QuantizedWeight:
    """A GGUF type without a lossless repack, from its dequantised float32 values.

    Four-bit-or-less types become int4 in groups of 32, the others int8 per output
    channel: a second rounding, so not bit-exact with the file (``kvrelay models`` and
    the load log say so).
    """
    if kind.name in FOUR_BIT_TYPES:
        return quantize_int4(weight, BLOCK)
    return quantize_int8(weight)
