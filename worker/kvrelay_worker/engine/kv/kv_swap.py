"""The host copy of the KV cache that swap preemption moves blocks into and back.

Host tensors are laid out block-major, ``[blocks, 2, block_size, kv_heads, head_dim]`` per
layer (the device cache is ``[2, blocks, ...]``), so one host block, or a run of
consecutive ones, is a single contiguous range: on CUDA it is pinned memory and every
copy is one asynchronous DMA queued on the current stream, never a pageable temporary
that the host would have to wait for or, worse, read before the copy landed.

The block id lists go to the device the same way (``block_copy.block_ids_on``): through
pinned memory, queued, not a pageable copy the host waits for.

Ordering comes from the stream (on the CPU every copy is synchronous). A swap-out is
queued before the forward pass that may write the freed device blocks; a swap-in before
the forward pass that reads them; a host block freed by a swap-in is only overwritten by
a later swap-out, queued behind it. The code is the same on both devices, so CPU tests
cover the logic of the GPU path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvrelay_worker.engine.kv.block_copy import as_bytes, block_ids_on

# (source block id, destination block id): device->host for a swap-out, host->device back.
BlockPairs = Sequence[tuple[int, int]]


def allocate_host_kv(device_caches: Sequence[torch.Tensor], num_blocks: int
                     ) -> list[torch.Tensor]:
    """One host tensor per layer with room for ``num_blocks`` blocks of the device shape.

    ``torch.empty``, not zeros: a block is only read after a swap-out wrote it, and the
    pages of an untouched pool cost nothing. Pinned when the cache lives on CUDA.
    """
    caches = []
    for cache in device_caches:
        shape = (num_blocks, 2, *cache.shape[2:])
        caches.append(torch.empty(shape, dtype=cache.dtype, device="cpu",
                                  pin_memory=cache.device.type == "cuda"))
    return caches


def contiguous_runs(ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(index into ids, first id, length)`` for each run of consecutive ids."""
    runs: list[tuple[int, int, int]] = []
    for i, block_id in enumerate(ids):
        if runs and runs[-1][1] + runs[-1][2] == block_id:
            start, first, length = runs[-1]
            runs[-1] = (start, first, length + 1)
        else:
            runs.append((i, block_id, 1))
    return runs


def copy_to_host(device_caches: Sequence[torch.Tensor], host_caches: Sequence[torch.Tensor],
                 pairs: BlockPairs) -> None:
    """Copy device blocks to host blocks (``pairs`` of device id, host id), every layer."""
    if not pairs:
        return
    device = device_caches[0].device
    device_ids = block_ids_on(device, [d for d, _ in pairs])
    runs = contiguous_runs([h for _, h in pairs])
    for dev, host in zip(device_caches, host_caches, strict=True):
        dev, host = as_bytes(dev), as_bytes(host)
        # Gathered into block-major order on the device, so each run is one copy.
        staged = dev.index_select(1, device_ids).transpose(0, 1).contiguous()
        for start, first, length in runs:
            host[first : first + length].copy_(staged[start : start + length],
                                               non_blocking=True)


def copy_to_device(host_caches: Sequence[torch.Tensor], device_caches: Sequence[torch.Tensor],
                   pairs: BlockPairs) -> None:
    """Copy host blocks back into device blocks (``pairs`` of host id, device id)."""
    if not pairs:
        return
    device = device_caches[0].device
    device_ids = block_ids_on(device, [d for _, d in pairs])
    runs = contiguous_runs([h for h, _ in pairs])
    for dev, host in zip(device_caches, host_caches, strict=True):
        dev, host = as_bytes(dev), as_bytes(host)
        staged = torch.empty((len(pairs), *host.shape[1:]), dtype=host.dtype, device=device)
        for start, first, length in runs:
            staged[start : start + length].copy_(host[first : first + length],
                                                 non_blocking=True)
        dev.index_copy_(1, device_ids, staged.transpose(0, 1))
