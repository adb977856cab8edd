"""Write new K/V rows into the paged cache, one slot per token."""

from __future__ import annotations

import torch


def store_kv_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy ``key[i]``/``value[i]`` to flat slot ``slot_mapping[i]``; slot -1 is skipped.

    Caches are ``[num_blocks, block_size, num_kv_heads, head_size]``; a flat slot is
    ``block * block_size + offset``.
    """
    num_kv_heads, head_size = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    if not bool(valid.all()):
        key, value, slots = key[valid], value[valid], slots[valid]
    key_cache.view(-1, num_kv_heads, head_size).index_copy_(0, slots, key.to(key_cache.dtype))
    value_cache.view(-1, num_kv_heads, head_size).index_copy_(
        0, slots, value.to(value_cache.dtype)
    )
