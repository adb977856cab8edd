"""A GGUF's RoPE scaling as Hugging Face's ``rope_scaling`` dict.

Most scaling is metadata (``rope.scaling.type``/``factor``/``original_context_length``),
but two kinds live in tensors: Llama 3.1/3.2's ``rope_freqs`` (per-frequency divisors,
from which we recover HF's ``llama3`` parameters) and Phi-3's long-context factors
(``rope_factors_long``/``rope_factors_short``: HF's ``longrope`` lists as they are, with
``rope.scaling.attn_factor`` kept only where it is not the value HF derives itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf.quants import dequantize

from kvrelay_worker.loading.gguf_metadata import GGUFTensorInfo
from kvrelay_worker.models.errors import UnsupportedModelError

ROPE_FREQS = "rope_freqs.weight"
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")
ROPE_TENSORS = (ROPE_FREQS, *ROPE_FACTORS)


def float32_value(value: Any) -> float:
    """The shortest decimal that rounds to the same float32 (1e-05, not 9.99999974738e-06).

    GGUF stores these as float32; widening gives ugly doubles that differ from the original
    config.json by float32 rounding. Any consumer computing in float32 sees the same bits.
    """
    return float(str(np.float32(value)))


def _values(tensor: GGUFTensorInfo) -> np.ndarray:
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float64).reshape(-1)


def rope_scaling(meta: Callable[[str, Any], Any], tensors: Mapping[str, GGUFTensorInfo],
                 theta: float, head_dim: int, max_positions: int, path: Path
                 ) -> dict[str, Any] | None:
    """HF's rope scaling for a file (``meta`` reads ``<arch>.``-prefixed keys)."""
    kind = meta("rope.scaling.type", None)
    factor = meta("rope.scaling.factor", None)
    original = meta("rope.scaling.original_context_length", None)
    if kind is None and meta("rope.scale_linear", None) is not None:
        kind, factor = "linear", meta("rope.scale_linear", None)
    freqs = tensors.get(ROPE_FREQS)
    if freqs is not None:
        if kind not in (None, "none"):
            raise UnsupportedModelError(
                f"{path}: rope_freqs together with {kind} rope scaling is not supported"
            )
        return _llama3_rope_from_divisors(_values(freqs), theta, head_dim, original, path)
    if ROPE_FACTORS[0] in tensors:
        return _longrope(meta, tensors, max_positions, original, path)
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float32_value(factor)}
    if kind == "yarn":
        if original is None:
            raise UnsupportedModelError(f"{path}: yarn scaling without its original length")
        return {
            "rope_type": "yarn",
            "factor": float32_value(factor),
            "original_max_position_embeddings": int(original),
        }
    raise UnsupportedModelError(f"{path}: rope scaling type {kind!r} is not supported")


def _longrope(meta: Callable[[str, Any], Any], tensors: Mapping[str, GGUFTensorInfo],
              max_positions: int, original: Any, path: Path) -> dict[str, Any]:
    """Phi-3's ``longrope`` (llama.cpp's ``su``) from its two factor tensors."""
    if original is None or ROPE_FACTORS[1] not in tensors:
        raise UnsupportedModelError(f"{path}: rope_factors_long without the short factors "
                                    "or the original context length")
    long, short = (_values(tensors[name]) for name in ROPE_FACTORS)
    scaling: dict[str, Any] = {
        "rope_type": "longrope",
        "long_factor": [float32_value(v) for v in long],
        "short_factor": [float32_value(v) for v in short],
        "original_max_position_embeddings": int(original),
    }
    scale = max_positions / int(original)
    derived = math.sqrt(1 + math.log(scale) / math.log(int(original))) if scale > 1 else 1.0
    stated = meta("rope.scaling.attn_factor", None)
    if stated is not None and abs(float(stated) - derived) > 1e-6 * derived:
        scaling["attention_factor"] = float32_value(stated)
    return scaling


def _llama3_rope_from_divisors(
    divisors: np.ndarray,
    theta: float,
    head_dim: int,
    original_hint: Any,
    path: Path,
) -> dict[str, Any] | None:
    """Recover HF's ``llama3`` rope parameters from llama.cpp's per-frequency divisors.

    Llama 3 scaling leaves short wavelengths alone, divides long ones by ``factor`` and
    blends in between with ``s = (orig/wavelen - low) / (high - low)``, i.e. s is linear in
    ``1/wavelen``. Only the two ratios ``orig/(high-low)`` and ``low/(high-low)`` are
    observable, so we fix ``low_freq_factor = 1`` (Meta's value; any choice with the same
    ratios gives identical frequencies) and solve for the rest, then check by recomputing.
    """
    expected_len = head_dim // 2
    if divisors.shape != (expected_len,):
        raise UnsupportedModelError(
            f"{path}: rope_freqs has {divisors.size} values, not {expected_len}"
        )
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0):
        return None
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / inv_freq
    candidates: list[tuple[float, float]] = []  # (high_freq_factor, original length)
    blend = (divisors > 1.0 + 1e-4) & (divisors < factor * (1 - 1e-4))
    if blend.sum() >= 2 and factor > 1.0:
        # 1/divisor = (1-s)/factor + s  =>  s = (1/divisor - 1/factor) / (1 - 1/factor)
        s = (1.0 / divisors[blend] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(1.0 / wavelen[blend], s, 1)
        if intercept < 0:
            span = -1.0 / intercept  # high - low, with low = 1
            candidates.append((round(1.0 + span, 4), float(slope) * span))
    candidates += [(4.0, float(original)) for original in (original_hint, 8192) if original]
    for high, original in candidates:
        original_int = round(original)
        if original_int <= 0 or high <= 1.0:
            continue
        rebuilt = _llama3_divisors(wavelen, factor, 1.0, high, original_int)
        if np.allclose(rebuilt, divisors, rtol=1e-4, atol=1e-6):
            return {
                "rope_type": "llama3",
                "factor": float32_value(factor),
                "low_freq_factor": 1.0,
                "high_freq_factor": high,
                "original_max_position_embeddings": original_int,
            }
    raise UnsupportedModelError(
        f"{path}: rope_freqs does not match Llama 3 rope scaling; cannot express it for "
        "Hugging Face"
    )


def _llama3_divisors(
    wavelen: np.ndarray, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3 scaling (the quantity HF divides inv_freq by)."""
    smooth = (original / wavelen - low) / (high - low)
    blended = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen > original / low, factor, blended)
    return np.where(wavelen < original / high, 1.0, out)


