"""The Triton rotary embedding against the reference, for plain and llama3-scaled tables."""

from __future__ import annotations

import math

import pytest
import torch

from kvrelay_kernels.reference.rotary import rotary_embedding_reference
from kvrelay_kernels.triton_kernels.rotary import rotary_embedding_triton

TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def plain_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim))


def llama3_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    """Llama 3.1's frequency rescaling, as Hugging Face's ``_compute_llama3_parameters``."""
    factor, low_freq_factor, high_freq_factor, old_context_len = 8.0, 1.0, 4.0, 8192
    inv_freq = plain_inv_freq(rot_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def cos_sin_table(inv_freq: torch.Tensor, max_position: int) -> torch.Tensor:
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def test_llama3_table_differs_from_plain():
    # Low frequencies are slowed down by the factor; the highest frequency is kept.
    plain, scaled = plain_inv_freq(128, 500000.0), llama3_inv_freq(128, 500000.0)
    assert scaled[0] == plain[0]
    assert torch.allclose(scaled[-1], plain[-1] / 8)


@pytest.mark.parametrize(
    ("layout", "is_neox", "head_size", "rot_dim", "table", "dtype", "pos_dtype"),
    [
        ("fused", True, 64, 64, "plain", torch.bfloat16, torch.int64),
        ("3d", False, 64, 32, "plain", torch.float32, torch.int32),
        ("2d", True, 128, 128, "llama3", torch.float16, torch.int64),
        ("fused", False, 128, 128, "llama3", torch.float32, torch.int64),
        ("3d", True, 80, 40, "plain", torch.bfloat16, torch.int32),  # half of 40 is no 2^k
    ],
)
def test_rotary_matches_reference(layout, is_neox, head_size, rot_dim, table, dtype, pos_dtype,
                                  device):
    num_tokens, q_heads, k_heads, max_position = 9, 4, 2, 20000
    inv_freq = (llama3_inv_freq if table == "llama3" else plain_inv_freq)(rot_dim, 500000.0)
    cos_sin = cos_sin_table(inv_freq, max_position).to(device)
    positions = torch.randint(0, max_position, (num_tokens,), device=device).to(pos_dtype)
    q_width, k_width = q_heads * head_size, k_heads * head_size
    fused = torch.randn(num_tokens, q_width + 2 * k_width, device=device).to(dtype)
    if layout == "fused":  # slices of one QKV projection: rows strided
        query, key = fused[:, :q_width], fused[:, q_width : q_width + k_width]
    elif layout == "2d":
        query, key = fused[:, :q_width].clone(), fused[:, q_width : q_width + k_width].clone()
    else:
        query = fused[:, :q_width].clone().view(num_tokens, q_heads, head_size)
        key = fused[:, q_width : q_width + k_width].clone().view(num_tokens, k_heads, head_size)
    value_before = fused[:, q_width + k_width :].clone()
    expected_q, expected_k = query.clone(), key.clone()
    rotary_embedding_reference(positions, (expected_q, expected_k), cos_sin, head_size, is_neox)
    rotary_embedding_triton(positions, query, key, cos_sin, head_size, is_neox)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(query, expected_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(key, expected_k, atol=atol, rtol=rtol)
    assert torch.equal(fused[:, q_width + k_width :], value_before)
