"""The Triton KV-cache store against the reference scatter."""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton


@pytest.mark.parametrize(
    ("num_kv_heads", "head_size", "block_size", "dtype", "slot_dtype"),
    [
        (2, 64, 16, torch.float32, torch.int64),
        (8, 80, 32, torch.bfloat16, torch.int32),
        (1, 128, 16, torch.float16, torch.int64),
        (3, 96, 16, torch.bfloat16, torch.int64),
    ],
)
def test_store_matches_reference_and_skips_padding(
    num_kv_heads, head_size, block_size, dtype, slot_dtype, device
):
    num_blocks, num_tokens = 6, 20
    key = torch.randn(num_tokens, num_kv_heads, head_size, device=device).to(dtype)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[[0, 7, 19]] = -1  # padding tokens
    slots = slots.to(slot_dtype)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(cache_shape, device=device).to(dtype)
    value_cache = torch.randn(cache_shape, device=device).to(dtype)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    store_kv_cache_reference(key, value, expected_k, expected_v, slots)
    store_kv_cache_triton(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_store_from_strided_key_and_value(device):
    # K and V as views of one fused projection: rows strided, heads contiguous.
    num_tokens, heads, head = 5, 2, 64
    fused = torch.randn(num_tokens, 3 * heads * head, device=device)
    key = fused[:, heads * head : 2 * heads * head].view(num_tokens, heads, head)
    value = fused[:, 2 * heads * head :].view(num_tokens, heads, head)
    key_cache = torch.zeros(2, 16, heads, head, device=device)
    value_cache = torch.zeros_like(key_cache)
    slots = torch.tensor([3, -1, 17, 0, 31], device=device)
    store_kv_cache_triton(key, value, key_cache, value_cache, slots)
    flat_k, flat_v = key_cache.view(-1, heads, head), value_cache.view(-1, heads, head)
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], key[i])
            assert torch.equal(flat_v[slot], value[i])
    assert flat_k.abs().sum(dim=(1, 2)).count_nonzero() == 4
