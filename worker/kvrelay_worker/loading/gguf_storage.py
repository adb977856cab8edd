"""What a GGUF file stores and what its weights take resident, from tensor headers only.

``kvrelay models`` prints it: the tensor types, their bytes in the file, and the resident
weight bytes when the file is dequantised to float32 (``quantization="none"``) or kept
quantized (``quantization="gguf"``: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
repacked losslessly in ``gguf_blocks.KEPT_LAYOUTS``' layouts, shard by shard in fused
layers that mix types too, float tensors as float32, other types requantized to int4 or
int8, which ``requantized_types`` names; mixture-of-experts stacks alike).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kvrelay_worker.loading.gguf_blocks import (
    FLOAT_TYPES,
    FOUR_BIT_TYPES,
    LOSSLESS_TYPES,
    kept_bytes,
)
from kvrelay_worker.loading.gguf_metadata import GGUFFile
from kvrelay_worker.loading.gguf_rope import ROPE_TENSORS


@dataclass(frozen=True)
class GGUFStorage:
    tensor_types: dict[str, int]  # type name -> number of tensors
    file_tensor_bytes: int
    float32_bytes: int
    kept_quantized_bytes: int

    @property
    def format(self) -> str:
        """E.g. ``GGUF Q4_1 (210 Q4_1, 61 F32, 1 Q8_0 tensors)``: the commonest matrix type."""
        matrices = {k: n for k, n in self.tensor_types.items() if k not in FLOAT_TYPES}
        main = max(matrices, key=lambda k: matrices[k]) if matrices else "F32"
        listing = ", ".join(f"{n} {k}" for k, n in sorted(self.tensor_types.items(),
                                                            key=lambda kv: -kv[1]))
        return f"GGUF {main} ({listing} tensors)"

    @property
    def requantized_types(self) -> list[str]:
        """Quantized types kept only after a second rounding (no lossless repack)."""
        return sorted(k for k in self.tensor_types
                      if k not in FLOAT_TYPES and k not in LOSSLESS_TYPES)


def gguf_storage(path: Path) -> GGUFStorage:
    reader = GGUFFile(path)
    types: Counter[str] = Counter()
    file_bytes = float32 = kept = 0
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        numel = int(math.prod(int(d) for d in tensor.shape))
        types[kind] += 1
        file_bytes += int(tensor.n_bytes)
        if tensor.name in ROPE_TENSORS:  # Llama 3's divisors, Phi-3's factors: rotary tables
            continue
        float32 += 4 * numel
        if kind in FLOAT_TYPES:
            kept += 4 * numel
        elif kind in LOSSLESS_TYPES:
            kept += kept_bytes(kind, numel)
        elif kind in FOUR_BIT_TYPES:
            kept += numel // 2 + numel // 32 * 4
        else:
            kept += numel + 4 * (numel // int(tensor.shape[0]))  # a scale per row
    return GGUFStorage(dict(types), file_bytes, float32, kept)
