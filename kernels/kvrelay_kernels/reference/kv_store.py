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

    Nothing here reads a device value on the host, so a CUDA graph can capture it (a
    decode step with padding rows): a skipped row is replaced by the first valid row, so
    it writes that row's bytes to that row's slot a second time, which changes nothing;
    when no row is valid, every row writes slot 0's own bytes back to it.
    """
    if slot_mapping.numel() == 0:
        return
    num_kv_heads, row = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    first_valid = valid.to(torch.uint8).argmax()  # 0 when none is
    rows = torch.where(valid, torch.arange(slots.numel(), device=slots.device), first_valid)
    slots = slots[rows].clamp(min=0)
    any_valid = valid.any()
    # index_copy_ has no float8 kernel on every device: copy the bytes instead.
    byte = torch.int8 if is_quantized_kv(key_cache.dtype) else key_cache.dtype
    for new, cache in ((key[rows], key_cache), (value[rows], value_cache)):
        if is_quantized_kv(cache.dtype):
            new = quantize_rows(new, cache.dtype)
        flat = cache.view(byte).view(-1, num_kv_heads, row)
        data = torch.where(any_valid, new.to(cache.dtype).view(byte), flat[slots])
        flat.index_copy_(0, slots, data)
