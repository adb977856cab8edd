"""Block ids whose element offsets pass 2**31 (skipped without CUDA: ~9 GB of cache).

A 32-bit offset computation would wrap and read or write the wrong place. The cache here
has over 2**31 elements per tensor and every sequence's blocks sit at its far end; the
compiled kernels must match the reference, which indexes with int64 throughout.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import TOLERANCES

from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton
from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a 9 GB cache)"),
]

BLOCK, KV_HEADS, HEAD, HEADS = 16, 1, 128, 4
PER_BLOCK = BLOCK * KV_HEADS * HEAD
NUM_BLOCKS = (1 << 31) // PER_BLOCK + 4096  # the last blocks start past element 2**31


def test_attention_and_store_past_two_to_the_31_elements() -> None:
    dtype = torch.bfloat16
    shape = (NUM_BLOCKS, BLOCK, KV_HEADS, HEAD)
    assert NUM_BLOCKS * PER_BLOCK > 1 << 31
    key_cache = torch.empty(shape, dtype=dtype, device="cuda")
    value_cache = torch.empty_like(key_cache)
    # Block 0 pads the shorter tables; the reference gathers it (masked), so no NaN there.
    key_cache[0].zero_()
    value_cache[0].zero_()
    query_lens, seq_lens = [1, 1, 20], [300, 33, 20 + 50]
    blocks_per_seq = [-(-n // BLOCK) for n in seq_lens]
    high = torch.arange(NUM_BLOCKS - sum(blocks_per_seq), NUM_BLOCKS, device="cuda")
    assert int(high[0]) * PER_BLOCK >= 1 << 31
    high = high[torch.randperm(high.numel(), device="cuda")]
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = high[start : start + n].to(torch.int32)
        start += n
    # Fill every slot of the used blocks through the store kernel (element offsets past
    # 2**31), then read them back with int64 indexing: a wrapped offset writes elsewhere.
    slots = (tables.long()[:, :, None] * BLOCK
             + torch.arange(BLOCK, device="cuda")).reshape(-1)
    slots = slots[tables.reshape(-1).repeat_interleave(BLOCK) > 0]
    key = torch.randn(slots.numel(), KV_HEADS, HEAD, device="cuda").to(dtype)
    value = torch.randn_like(key)
    store_kv_cache_triton(key, value, key_cache, value_cache, slots)
    flat_k = key_cache.view(-1, KV_HEADS, HEAD)
    flat_v = value_cache.view(-1, KV_HEADS, HEAD)
    assert torch.equal(flat_k[slots], key)
    assert torch.equal(flat_v[slots], value)

    starts = torch.tensor([0, 1, 2, 22], dtype=torch.int32, device="cuda")
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    query = torch.randn(sum(query_lens), HEADS, HEAD, device="cuda").to(dtype)
    scale = HEAD**-0.5
    expected = paged_attention_reference(query, key_cache, value_cache, tables, starts, lens,
                                         scale)
    got = paged_attention_triton(query, key_cache, value_cache, tables, starts, lens, scale)
    assert not got.isnan().any()
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)
    # Decode alone (the split-KV kernel) as well as the mixed batch (the prefill kernel).
    decode_expected = paged_attention_reference(query[:2], key_cache, value_cache,
                                                tables[:2], starts[:3], lens[:2], scale)
    decode_got = paged_attention_triton(query[:2], key_cache, value_cache, tables[:2],
                                        starts[:3], lens[:2], scale)
    torch.testing.assert_close(decode_got.float(), decode_expected.float(), atol=atol,
                               rtol=rtol)
