"""Write new K/V rows into the paged cache, one slot per token."""

from __future__ import annotations

import torch

from kvrelay_kernels.kv_quant import block_exponents, block_values, is_quantized_kv, quantize_values


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
    quantized: its values into the block's rows, its scale into the block's tail.

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
    if is_quantized_kv(key_cache.dtype):
        _store_quantized(key[rows], value[rows], key_cache, value_cache, slots, any_valid)
        return
    for new, cache in ((key[rows], key_cache), (value[rows], value_cache)):
        flat = cache.view(-1, num_kv_heads, row)
        data = torch.where(any_valid, new.to(cache.dtype), flat[slots])
        flat.index_copy_(0, slots, data)


def _store_quantized(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slots: torch.Tensor,
                     any_valid: torch.Tensor) -> None:
    """Quantize and write rows to non-negative ``slots`` (see the caller for ``any_valid``).

    Bytes throughout: float8 has no indexing kernels on every device.
    """
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    for new, cache in ((key, key_cache), (value, value_cache)):
        values, exponents = quantize_values(new, cache.dtype)
        for dest, data in ((block_values(cache).view(torch.int8), values.view(torch.int8)),
                           (block_exponents(cache), exponents)):
            data = torch.where(any_valid, data, dest[blocks, offsets])
            dest.index_put_((blocks, offsets), data)
