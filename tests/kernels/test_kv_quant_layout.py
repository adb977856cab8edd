"""The quantized KV cache's block layout (``kv_quant``): each block holds its rows of
values back to back, every row starting on a 16-byte boundary, then one scale byte per
row in a tail; the reference store and the Triton store (interpreted on CPU) both write
exactly there, and the capacity stays that of ``head_size + 1`` bytes a row."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from attention_cases import QUANT_DTYPES, TOLERANCES, make_batch

from kvrelay_kernels.attention import SUPPORTED_HEAD_SIZES
from kvrelay_kernels.kv_quant import (
    block_exponents,
    block_values,
    kv_row_size,
    quantize_blocks,
    quantize_values,
)
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton
from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton


def _byte_offset(view: torch.Tensor, base: torch.Tensor, index: tuple[int, ...]) -> int:
    """Byte offset of ``view[index]`` from the start of ``base``'s storage."""
    return (view.storage_offset() - base.storage_offset()
            + sum(i * s for i, s in zip(index, view.stride(), strict=True)))


@pytest.mark.parametrize("head_size", SUPPORTED_HEAD_SIZES)
@pytest.mark.parametrize("num_kv_heads", [1, 3, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_every_row_starts_on_a_16_byte_boundary(head_size: int, num_kv_heads: int,
                                                block_size: int) -> None:
    cache = torch.zeros((3, block_size, num_kv_heads, head_size + 1), dtype=torch.int8)
    values = block_values(cache)
    block_bytes = block_size * num_kv_heads * (head_size + 1)
    for block in range(3):
        for slot in range(block_size):
            for head in range(num_kv_heads):
                within = _byte_offset(values, cache, (block, slot, head, 0)) - block * block_bytes
                assert within % 16 == 0, (block, slot, head, within)
                assert within == (slot * num_kv_heads + head) * head_size
    # The scales fill the block's tail, one byte per row in the rows' order.
    exponents = block_exponents(cache)
    tail = block_size * num_kv_heads * head_size
    assert _byte_offset(exponents, cache, (1, 2, num_kv_heads - 1)) == (
        block_bytes + tail + 2 * num_kv_heads + num_kv_heads - 1)
    if block_size * num_kv_heads % 16 == 0:
        assert block_bytes % 16 == 0  # and then every block starts aligned too


def test_int8_rows_cost_head_size_plus_one_bytes() -> None:
    """The tail keeps the capacity: 64 + 1 bytes a row, 3.94x the float32 blocks."""
    assert kv_row_size(64, torch.int8) == 65
    assert 64 * 4 / kv_row_size(64, torch.int8) >= 3.9


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
def test_stores_write_values_and_scales_at_their_layout_offsets(kv_dtype: torch.dtype,
                                                                device: str) -> None:
    """Decoded by hand from the raw bytes: a token's values at ``(slot * H + head) * D`` of
    its block, its scale at ``B * H * D + slot * H + head``; both stores agree."""
    blocks, block_size, kv_heads, head = 3, 8, 2, 64
    tokens = 7
    key = torch.randn(tokens, kv_heads, head) * torch.logspace(-2, 2, tokens)[:, None, None]
    value = -key
    slots = torch.tensor([9, 0, 23, 15, 8, 16, 3])
    want_values, want_exponents = quantize_values(key, kv_dtype)
    shape = (blocks, block_size, kv_heads, head + 1)
    ref = [torch.zeros(shape, dtype=kv_dtype) for _ in range(2)]
    store_kv_cache_reference(key, value, ref[0], ref[1], slots)
    got = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(2)]
    store_kv_cache_triton(key.to(device), value.to(device), got[0], got[1], slots.to(device))
    block_bytes = block_size * kv_heads * (head + 1)
    for cache in (ref[0], got[0].cpu()):
        raw = cache.view(torch.int8).reshape(-1)
        for token, slot in enumerate(slots.tolist()):
            block, offset = divmod(slot, block_size)
            for h in range(kv_heads):
                start = block * block_bytes + (offset * kv_heads + h) * head
                assert torch.equal(raw[start : start + head],
                                   want_values[token, h].view(torch.int8))
                scale_at = block * block_bytes + block_size * kv_heads * head
                scale_at += offset * kv_heads + h
                assert raw[scale_at] == want_exponents[token, h]
    for a, b in zip(ref, got, strict=True):
        assert torch.equal(a.view(torch.int8), b.cpu().view(torch.int8))


@pytest.mark.parametrize("block_size", [8, 32])
def test_triton_reads_the_layout_at_other_block_sizes(block_size: int, device: str) -> None:
    """The attention tile finds each row's scale from the block size and head count: an
    odd head count and block sizes other than the other tests' 16, decode and prefill."""
    clean, _ = make_batch([1, 9, 1], [40, 30, 8], num_heads=6, num_kv_heads=3, head_size=64,
                          block_size=block_size, dtype=torch.float32, device="cpu")
    key_cache = quantize_blocks(clean.key_cache.nan_to_num(0.0), torch.int8)
    value_cache = quantize_blocks(clean.value_cache.nan_to_num(0.0), torch.int8)
    batch = replace(clean, key_cache=key_cache, value_cache=value_cache)
    expected = paged_attention_reference(*batch.args(), 0.125)
    on_device = replace(batch, query=batch.query.to(device),
                        key_cache=key_cache.to(device), value_cache=value_cache.to(device),
                        block_tables=batch.block_tables.to(device),
                        query_start_loc=batch.query_start_loc.to(device),
                        seq_lens=batch.seq_lens.to(device))
    got = paged_attention_triton(*on_device.args(), 0.125)
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol)
