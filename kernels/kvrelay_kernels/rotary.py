"""Public entry point: rotary position embedding applied to query and key in place.

CUDA takes the Triton kernel; float32 ``[tokens, heads * head_size]`` rows on CPU the C++
one (``cpu_kernels/rotary.cpp``); everything else the reference.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.backend import cpu_float32_kernel, select_backend
from kvrelay_kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    KernelArgumentError,
    check_dims,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
)
from kvrelay_kernels.reference.rotary import rotary_embedding_reference


def _check_heads(name: str, x: torch.Tensor, num_tokens: int, head_size: int) -> None:
    """Each token's row must be whole heads, each head contiguous (rows may be strided)."""
    if x.dim() not in (2, 3) or x.shape[0] != num_tokens:
        raise KernelArgumentError(
            f"{name} must be [{num_tokens}, heads * head_size] or [{num_tokens}, heads, "
            f"head_size], got {tuple(x.shape)}"
        )
    check_last_dim_contiguous(name, x)
    if x.dim() == 2 and x.shape[1] % head_size != 0:
        raise KernelArgumentError(
            f"{name} width {x.shape[1]} is not a whole number of heads of size {head_size}"
        )
    if x.dim() == 3 and (x.shape[2] != head_size or x.stride(1) != head_size):
        raise KernelArgumentError(
            f"{name} must hold contiguous heads of size {head_size}, got shape "
            f"{tuple(x.shape)} with strides {x.stride()}"
        )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    """Rotate ``query`` and ``key`` in place by each token's position.

    ``query``/``key``: ``[num_tokens, heads * head_size]`` or ``[num_tokens, heads,
    head_size]``; ``cos_sin_cache``: ``[max_position, rot_dim]`` (cosines then sines,
    float32); ``positions``: ``[num_tokens]``. Build the table with the model's own
    frequencies (plain, llama3-scaled, ...): the kernel does not care how.
    """
    check_dims("positions", positions, 1)
    check_dtype("positions", positions, INDEX_DTYPES)
    check_dims("cos_sin_cache", cos_sin_cache, 2)
    check_dtype("query", query, FLOAT_DTYPES)
    check_dtype("key", key, FLOAT_DTYPES)
    check_same_device(positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    num_tokens = positions.shape[0]
    rot_dim = cos_sin_cache.shape[1]
    for name, x in (("query", query), ("key", key)):
        _check_heads(name, x, num_tokens, head_size)
    if rot_dim > head_size or rot_dim % 2 != 0:
        raise KernelArgumentError(
            f"rotary dim {rot_dim} must be even and at most head_size {head_size}"
        )
    if num_tokens == 0:
        return
    if select_backend(query.device) == "triton":
        from kvrelay_kernels.triton_kernels.rotary import rotary_embedding_triton

        rotary_embedding_triton(positions, query, key, cos_sin_cache, head_size, is_neox)
    elif (query.dim() == 2 and key.dim() == 2 and positions.is_contiguous()
          and cos_sin_cache.is_contiguous() and cpu_float32_kernel(query, key, cos_sin_cache)):
        torch.ops.kvrelay_cpu.rotary_embedding(positions, query, key, cos_sin_cache, head_size,
                                               is_neox)
    else:
        rotary_embedding_reference(positions, (query, key), cos_sin_cache, head_size, is_neox)
