"""Write new K/V rows into the paged cache, one slot per token."""

from __future__ import annotations

import torch

from kvrelay_kernels.kv_quant import is_quantized_kv, quantize_rows


def store_kv_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy ``key[i]``/``value[i]`` to flat slot ``slot_mapping[i]``; slot -1 is skipped.

    Caches are ``[num_blocks, block_size, num_kv_heads, row]``; a flat slot is
    ``block * block_size + offset``. A quantized cache (``kv_quant``) gets each row
    quantized, its scale byte included.
    """
    num_kv_heads, row = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    if not bool(valid.all()):
        key, value, slots = key[valid], value[valid], slots[valid]
    if is_quantized_kv(key_cache.dtype):
        key, value = quantize_rows(key, key_cache.dtype), quantize_rows(value, key_cache.dtype)
    # index_copy_ has no float8 kernel on every device: copy the bytes instead.
    byte = torch.int8 if is_quantized_kv(key_cache.dtype) else key_cache.dtype
    key_cache.view(byte).view(-1, num_kv_heads, row).index_copy_(
        0, slots, key.to(key_cache.dtype).view(byte))
    value_cache.view(byte).view(-1, num_kv_heads, row).index_copy_(
        0, slots, value.to(value_cache.dtype).view(byte))
