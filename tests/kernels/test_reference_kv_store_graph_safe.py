"""The reference KV store reads no device value on the host, so CUDA graphs can capture it.

``KVRELAY_KERNELS=reference`` with CUDA graphs on captured decode steps with padding rows
(slot -1); the store used ``bool(valid.all())``, a host read, which capture refuses. On the
CPU the same property shows on the meta device, which has no values to read: every
operation must work from shapes alone. Then its results: padding rows change nothing,
also when one would land on slot 0 beside a real write there, and a batch of padding
only leaves the cache as it was.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.kv_quant import block_exponents, block_values, is_quantized_kv
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference

HEADS, HEAD, BLOCK, BLOCKS = 2, 8, 4, 3


def _caches(dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    shape = (BLOCKS, BLOCK, HEADS, HEAD + (1 if dtype in (torch.int8,
                                                        torch.float8_e4m3fn) else 0))
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta"), torch.empty(
            shape, dtype=dtype, device="meta")
    return (torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))


def _slot_bytes(cache: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """Each slot's bytes (a quantized cache's: the values, then the scales: ``kv_quant``)."""
    if not is_quantized_kv(cache.dtype):
        return cache.view(-1, HEADS, cache.shape[-1])[slots].view(torch.uint8)
    index = torch.tensor(slots)
    blocks, offsets = index // BLOCK, index % BLOCK
    values = block_values(cache).view(torch.uint8)[blocks, offsets]
    scales = block_exponents(cache).view(torch.uint8)[blocks, offsets]
    return torch.cat([values.reshape(len(slots), -1), scales.reshape(len(slots), -1)], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8,
                                   torch.float8_e4m3fn])
def test_the_store_needs_no_values_on_the_host(dtype: torch.dtype) -> None:
    key_cache, value_cache = _caches(dtype, "meta")
    rows = torch.empty(5, HEADS, HEAD, device="meta")
    slots = torch.empty(5, dtype=torch.int32, device="meta")
    store_kv_cache_reference(rows, rows, key_cache, value_cache, slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_padding_rows_change_nothing(dtype: torch.dtype) -> None:
    key_cache, value_cache = _caches(dtype)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    key, value = torch.randn(4, HEADS, HEAD), torch.randn(4, HEADS, HEAD)
    slots = torch.tensor([-1, 0, 7, -1], dtype=torch.int32)
    store_kv_cache_reference(key, value, key_cache, value_cache, slots)
    want_k, want_v = before_k.clone(), before_v.clone()
    store_kv_cache_reference(key[1:3], value[1:3], want_k, want_v, slots[1:3])
    assert torch.equal(key_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), want_v.view(torch.uint8))
    untouched = [s for s in range(BLOCKS * BLOCK) if s not in (0, 7)]
    assert torch.equal(_slot_bytes(key_cache, untouched), _slot_bytes(before_k, untouched))
    if dtype == torch.float32:
        flat = key_cache.view(-1, HEADS, key_cache.shape[-1])
        assert torch.equal(flat[0], key[1])
        assert torch.equal(flat[7], key[2])


def test_a_batch_of_padding_only_leaves_the_cache_as_it_was() -> None:
    key_cache, value_cache = _caches(torch.float32)
    before = key_cache.clone(), value_cache.clone()
    rows = torch.randn(3, HEADS, HEAD)
    store_kv_cache_reference(rows, rows, key_cache, value_cache,
                             torch.full((3,), -1, dtype=torch.int64))
    assert torch.equal(key_cache, before[0])
    assert torch.equal(value_cache, before[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_graph_captures_the_reference_store() -> None:
    key_cache, value_cache = (c.cuda() for c in _caches(torch.bfloat16))
    key = torch.randn(4, HEADS, HEAD, device="cuda")
    slots = torch.tensor([3, -1, 5, -1], dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture wants
        store_kv_cache_reference(key, key, key_cache, value_cache, slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_kv_cache_reference(key, key, key_cache, value_cache, slots)
    key.copy_(torch.randn_like(key))
    graph.replay()
    torch.cuda.synchronize()
    flat = key_cache.view(-1, HEADS, HEAD)
    assert torch.equal(flat[3], key[0].to(torch.bfloat16))
    assert torch.equal(flat[5], key[2].to(torch.bfloat16))
