"""The swap copies move whole blocks, every layer, between the device pool and the host
pool by block id: each host block ends up holding exactly its device block's K and V
(host layout ``[blocks, 2, ...]`` against the device's ``[2, blocks, ...]``), nothing
else is touched, and a swap-in puts it back bit for bit into other device blocks. Runs
on the CPU, and on CUDA too where there is one (the code is the same)."""

from __future__ import annotations

import pytest
import torch

from kvrelay_worker.engine.kv.kv_swap import (
    allocate_host_kv,
    contiguous_runs,
    copy_to_device,
    copy_to_host,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LAYERS, BLOCKS, HOST_BLOCKS, BLOCK_SIZE, HEADS, DIM = 3, 10, 6, 4, 2, 8


def device_caches(device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (2, BLOCKS, BLOCK_SIZE, HEADS, DIM)
    return [torch.randn(shape, generator=gen).to(device) for _ in range(LAYERS)]


def test_contiguous_runs() -> None:
    assert contiguous_runs([]) == []
    assert contiguous_runs([3, 4, 5, 0, 7, 8]) == [(0, 3, 3), (3, 0, 1), (4, 7, 2)]
    assert contiguous_runs([2, 1]) == [(0, 2, 1), (1, 1, 1)]


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_round_trip_by_id(device: str) -> None:
    dev = device_caches(device)
    original = [c.clone() for c in dev]
    host = allocate_host_kv(dev, HOST_BLOCKS)
    assert host[0].shape == (HOST_BLOCKS, 2, BLOCK_SIZE, HEADS, DIM)
    assert host[0].device.type == "cpu"
    assert host[0].is_pinned() == (device == "cuda")
    for h in host:
        h.fill_(-7.0)
    # A run of consecutive host blocks, then out-of-order ones.
    out_pairs = [(7, 1), (2, 2), (9, 3), (0, 5), (4, 0)]
    copy_to_host(dev, host, out_pairs)
    if device == "cuda":
        torch.cuda.synchronize()
    for layer in range(LAYERS):
        for d, h in out_pairs:
            assert torch.equal(host[layer][h, 0], dev[layer][0, d].cpu()), (layer, d, h)
            assert torch.equal(host[layer][h, 1], dev[layer][1, d].cpu()), (layer, d, h)
        assert bool((host[layer][4] == -7.0).all()), "a host block not asked for was written"
    # The device blocks are reused by others, then the sequence comes back elsewhere.
    for c in dev:
        c.zero_()
    in_pairs = [(1, 8), (2, 3), (3, 4), (5, 0), (0, 6)]
    copy_to_device(host, dev, in_pairs)
    for layer in range(LAYERS):
        for (d_old, _), (_, d_new) in zip(out_pairs, in_pairs, strict=True):
            assert torch.equal(dev[layer][:, d_new], original[layer][:, d_old]), layer
        untouched = [b for b in range(BLOCKS) if b not in {d for _, d in in_pairs}]
        assert bool((dev[layer][:, untouched] == 0).all()), "a device block not asked for"


def test_no_pairs_is_a_no_op() -> None:
    dev = device_caches("cpu")
    host = allocate_host_kv(dev, 1)
    copy_to_host(dev, host, [])
    copy_to_device(host, dev, [])
