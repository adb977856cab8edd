"""Block copies of a quantized KV cache move values and scales together, byte for byte:
copy-on-write (``copy_blocks``) and swap out/in (``kv_swap``), for int8 and float8 caches
(torch has no ``index_copy_`` for float8: the copies go through an int8 view)."""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels import store_kv_cache
from kvrelay_worker.engine.kv.block_copy import copy_blocks
from kvrelay_worker.engine.kv.kv_swap import allocate_host_kv, copy_to_device, copy_to_host

BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD = 6, 4, 2, 8


def _filled_cache(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``[2, blocks, block_size, kv_heads, head + 1]`` with every slot written by the
    store kernel, at magnitudes that give every row a different scale byte."""
    generator = torch.Generator().manual_seed(seed)
    cache = torch.zeros((2, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD + 1), dtype=dtype)
    tokens = BLOCKS * BLOCK_SIZE
    magnitudes = torch.logspace(-3, 3, tokens)[:, None, None]
    key = torch.randn((tokens, KV_HEADS, HEAD), generator=generator) * magnitudes
    value = torch.randn((tokens, KV_HEADS, HEAD), generator=generator) * magnitudes
    store_kv_cache(key, value, cache[0], cache[1], torch.arange(tokens))
    return cache


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int8)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_copy_on_write_copies_values_and_scales(dtype: torch.dtype) -> None:
    cache = _filled_cache(dtype, seed=1)
    before = cache.clone()
    copy_blocks([cache], [(1, 4), (4, 1)])  # every source is read before any write
    assert torch.equal(_bytes(cache[:, 4]), _bytes(before[:, 1]))
    assert torch.equal(_bytes(cache[:, 1]), _bytes(before[:, 4]))
    assert torch.equal(_bytes(cache[:, [0, 2, 3, 5]]), _bytes(before[:, [0, 2, 3, 5]]))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_swap_out_and_in_restores_the_bytes(dtype: torch.dtype) -> None:
    cache = _filled_cache(dtype, seed=2)
    original = cache.clone()
    host = allocate_host_kv([cache], 4)
    copy_to_host([cache], host, [(2, 0), (3, 1), (5, 3)])
    cache.view(torch.int8)[:, [2, 3, 5]] = 0  # the freed device blocks get overwritten
    copy_to_device(host, [cache], [(0, 2), (1, 3), (3, 5)])
    assert torch.equal(_bytes(cache), _bytes(original))
