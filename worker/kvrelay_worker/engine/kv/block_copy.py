"""Device block copies for copy-on-write: a forked beam's shared partial block, duplicated
before the forward pass writes into it (the same stream-ordered style as ``kv_swap``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvrelay_worker.engine.runner.transfer import host_to_device


def copy_blocks(caches: Sequence[torch.Tensor], pairs: Sequence[tuple[int, int]]) -> None:
    """Copy block ``src`` over block ``dst`` for every ``(src, dst)`` pair, every layer.

    Every source is read before any destination is written, so a block may be both.
    """
    if not pairs:
        return
    device = caches[0].device
    src = block_ids_on(device, [s for s, _ in pairs])
    dst = block_ids_on(device, [d for _, d in pairs])
    for cache in caches:  # [2, blocks, block_size, kv_heads, row]
        raw = as_bytes(cache)
        raw.index_copy_(1, dst, raw.index_select(1, src))


def block_ids_on(device: torch.device, ids: Sequence[int]) -> torch.Tensor:
    """``ids`` as an int64 tensor on ``device``, staged through pinned memory on CUDA
    (``torch.tensor(ids, device=cuda)`` copies from pageable memory: the host waits)."""
    return host_to_device(torch.tensor(ids, dtype=torch.int64), device)


def as_bytes(cache: torch.Tensor) -> torch.Tensor:
    """A float8 cache viewed as int8 (torch has no index_copy_ for float8); others as is.

    A quantized block is moved as its bytes, values and scales together."""
    return cache.view(torch.int8) if cache.dtype == torch.float8_e4m3fn else cache
