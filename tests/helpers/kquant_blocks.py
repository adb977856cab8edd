"""GGUF block bytes for the types ``gguf.quants`` can decode but not make (the K-quants).

``gguf.quants.quantize`` has no Q4_K/Q5_K/Q6_K encoder, so these are random bytes: every
byte pattern is a valid block except a non-finite float16 field (``d``, ``dmin``), so those
are drawn apart. ``wild`` draws them from every finite float16 (the repack must keep any
block's bits); otherwise they are drawn at the magnitude that gives weights of standard
deviation near ``std`` (a model's or a product's numbers stay in a sane range).
``write_typed_gguf`` writes a tiny model's GGUF with each matrix in the type asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

from helpers.tiny_gguf import TINY_VOCAB_SIZE, write_gguf_from_hf
from helpers.tiny_models import build_tiny_model

Q = gguf.GGMLQuantizationType
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# Byte offsets of the float16 fields of a super-block, and the d, dmin that give weights
# of standard deviation 1 with the random sub-scales and values of that type:
# Q4_K: 6-bit sub-scales (mean 31.5) times 4-bit values (sd 4.6); the mean of d * sc * q is
# cancelled on average by dmin * m (m mean 31.5). Q5_K: 5-bit values (sd 9.2, mean 15.5).
# Q6_K: int8 sub-scales (mean |sc| 64) times q - 32 (sd 18.5).
_HALF_FIELDS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
_UNIT = {Q.Q4_K: (1 / 145, 7.5 / 145), Q.Q5_K: (1 / 290, 15.5 / 290), Q.Q6_K: (1 / 1184,)}


def k_quant_blocks(qtype: gguf.GGMLQuantizationType, rows: int, in_features: int,
                   rng: np.random.Generator, *, std: float = 0.02,
                   wild: bool = False) -> np.ndarray:
    """``[rows, bytes per row]`` uint8 blocks of a K-quant type (as the GGUF reader gives)."""
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = in_features // block
    raw = rng.integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for offset, unit in zip(_HALF_FIELDS[qtype], _UNIT[qtype], strict=True):
        if wild:
            bits = rng.integers(0, 1 << 16, (rows, blocks), dtype=np.uint16)
            values = bits.view(np.float16)
            values = np.where(np.isfinite(values), values, np.float16(1.5))
        else:
            values = (unit * std * rng.uniform(0.5, 1.5, (rows, blocks))).astype(np.float16)
        raw[..., offset:offset + 2] = values.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, blocks * size)


def write_typed_gguf(root: Path, tensor_type: Callable[[str], gguf.GGMLQuantizationType],
                     model: str = "llama3-rope") -> Path:
    """A Llama (q/k rows permuted in the file, untied LM head; or another tiny ``model``,
    its folder in ``root / "model"``) with each matrix of the type ``tensor_type(gguf
    name)``; K-quant tensors are random blocks, the others quantize the model's weights."""
    folder = build_tiny_model(model, root / "model", vocab_size=TINY_VOCAB_SIZE)
    rng = np.random.default_rng(8)

    def encode(name: str, values: np.ndarray) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
        qtype = tensor_type(name)
        if qtype in K_QUANTS:
            return k_quant_blocks(qtype, values.shape[0], values.shape[1], rng), qtype
        return gguf.quants.quantize(values, qtype), qtype

    return write_gguf_from_hf(folder, root / "typed.gguf", encode=encode)


def typed_by_layer(layer_types: list[dict[str, gguf.GGMLQuantizationType]]
                   ) -> Callable[[str], gguf.GGMLQuantizationType]:
    """``write_typed_gguf``'s ``tensor_type`` from one ``{kind: type}`` per layer
    (``blk.N.KIND.weight``): the embeddings Q4_K, the output head Q6_K."""
    def tensor_type(name: str) -> gguf.GGMLQuantizationType:
        if name == "token_embd.weight":
            return gguf.GGMLQuantizationType.Q4_K
        if name == "output.weight":
            return gguf.GGMLQuantizationType.Q6_K
        _, layer, kind, _ = name.split(".")
        return layer_types[int(layer)][kind]

    return tensor_type
