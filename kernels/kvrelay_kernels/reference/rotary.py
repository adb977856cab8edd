"""Rotary position embedding applied in place from a precomputed cos/sin table."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate the last dimension of ``x`` ([tokens, heads, rot_dim]) by the given angles."""
    xf = x.to(torch.float32)
    if is_neox:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding_reference(
    positions: torch.Tensor,
    tensors: Sequence[torch.Tensor],
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    """Rotate each of ``tensors`` (a layer's query and key) in place.

    Each is ``[tokens, num_heads * head_size]`` or ``[tokens, num_heads, head_size]``
    (rows may be strided, as in a slice of a fused QKV output); ``cos_sin_cache`` is
    ``[max_position, rot_dim]`` holding the cosines then the sines of each position's
    angles, looked up once for all of them. Only the first ``rot_dim`` features of each
    head rotate. ``is_neox`` pairs feature ``i`` with ``i + rot_dim/2`` (Hugging Face's
    ``rotate_half``); otherwise adjacent features pair up (GPT-J style).
    """
    rot_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions.to(torch.int64)].to(torch.float32).chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in tensors:
        heads = x if x.dim() == 3 else x.unflatten(-1, (-1, head_size))
        rotated = _rotate(heads[..., :rot_dim], cos, sin, is_neox)
        heads[..., :rot_dim] = rotated.to(x.dtype)
