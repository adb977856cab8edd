"""Public entry point: write new K/V rows into the paged cache.

CUDA takes the Triton kernel; float32 rows into a float32 cache on CPU the C++ one
(``cpu_kernels/kv_store.cpp``); quantized caches and other dtypes the reference.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.backend import cpu_float32_kernel, select_backend
from kvrelay_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelArgumentError,
    check_contiguous,
    check_dims,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
)
from kvrelay_kernels.kv_quant import QUANTIZED_KV_DTYPES, is_quantized_kv, kv_row_size
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference


def check_store_kv_cache_args(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_dims("key", key, 3)
    check_dims("key_cache", key_cache, 4)
    check_dims("value", value, 3)
    check_dtype("key_cache", key_cache, FLOAT_DTYPES + QUANTIZED_KV_DTYPES)
    num_tokens, head_size = key.shape[0], key.shape[2]
    num_kv_heads = key_cache.shape[2]
    check_shape("key", key, (num_tokens, num_kv_heads, head_size))
    check_shape("value", value, (num_tokens, num_kv_heads, head_size))
    check_shape("key_cache", key_cache,
                (None, None, num_kv_heads, kv_row_size(head_size, key_cache.dtype)))
    check_shape("value_cache", value_cache, tuple(key_cache.shape))
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    check_dtype("key", key, FLOAT_DTYPES)
    check_dtype("slot_mapping", slot_mapping, INDEX_DTYPES)
    check_same_dtype(key=key, value=value)
    check_same_dtype(key_cache=key_cache, value_cache=value_cache)
    check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                      slot_mapping=slot_mapping)
    check_contiguous("key_cache", key_cache)
    check_contiguous("value_cache", value_cache)
    check_last_dim_contiguous("key", key)
    check_last_dim_contiguous("value", value)
    if key.dtype != key_cache.dtype and not is_quantized_kv(key_cache.dtype):
        raise KernelArgumentError(
            f"key is {key.dtype} but the cache is {key_cache.dtype}; cast before storing"
        )


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy each token's K/V (``[num_tokens, num_kv_heads, head_size]``) to its slot.

    Caches are ``[num_blocks, block_size, num_kv_heads, head_size]``; ``slot_mapping[i]``
    is ``block * block_size + offset``, or -1 to skip token ``i`` (padding). A quantized
    cache (int8 or float8_e4m3fn, last dimension ``head_size + 1``, blocks laid out as
    ``kv_quant`` says) gets each token's rows quantized with their scale.
    """
    check_store_kv_cache_args(key, value, key_cache, value_cache, slot_mapping)
    if key.shape[0] == 0:
        return
    if select_backend(key.device) == "triton":
        from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton

        store_kv_cache_triton(key, value, key_cache, value_cache, slot_mapping)
    elif key_cache.dtype == key.dtype and cpu_float32_kernel(key, value, key_cache, value_cache):
        torch.ops.kvrelay_cpu.store_kv_cache(key, value, key_cache, value_cache,
                                             slot_mapping.contiguous())
    else:
        store_kv_cache_reference(key, value, key_cache, value_cache, slot_mapping)
