"""Rotary embedding tables (cos/sin per position) for the RoPE variants we support.

The frequencies are computed exactly as Hugging Face computes them, in float32, so a
float32 model matches transformers token for token. The kernel that applies the table
(``kvrelay_kernels.rotary_embedding``) does not care which variant built it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvrelay_worker.models.errors import UnsupportedModelError


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(
        torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's scheme: stretch low frequencies, keep high ones, blend in between."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    original_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = original_len / low_freq_factor
    high_freq_wavelen = original_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = default_inv_freq(head_dim, theta)
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return llama3_inv_freq(inv_freq, scaling)
    raise UnsupportedModelError(
        f"rope scaling type {rope_type!r} is not supported (supported: default, linear, llama3)"
    )


def build_cos_sin_cache(head_dim: int, theta: float, scaling: dict[str, Any] | None,
                        max_position: int, device: torch.device | str | None = None
                        ) -> torch.Tensor:
    """``[max_position, head_dim]`` float32: cosines then sines of every position's angles.

    Computed on the CPU whatever device is the default: a model is first built on
    ``meta``, where this arithmetic would run through PyTorch's reference decompositions
    (importing ``torch._dynamo``: seconds at every worker start) for a table thrown away."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    positions = torch.arange(max_position, dtype=torch.int64, device="cpu").to(torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return table if device is None else table.to(device)
