"""Public entry point: paged attention for any mix of decode and prefill sequences."""

from __future__ import annotations

import math

import torch

from kvrelay_kernels.backend import cpu_kernels_allowed, select_backend
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
from kvrelay_kernels.kv_quant import QUANTIZED_KV_DTYPES, kv_row_size
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

SUPPORTED_HEAD_SIZES = (64, 80, 96, 128, 256)


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    check_dims("query", query, 3)
    check_dims("key_cache", key_cache, 4)
    check_dims("block_tables", block_tables, 2)
    check_dims("query_start_loc", query_start_loc, 1)
    check_dims("seq_lens", seq_lens, 1)
    num_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    check_dtype("key_cache", key_cache, FLOAT_DTYPES + QUANTIZED_KV_DTYPES)
    row = kv_row_size(head_size, key_cache.dtype)
    check_shape("key_cache", key_cache, (None, None, num_kv_heads, row))
    check_shape("value_cache", value_cache, tuple(key_cache.shape))
    check_shape("block_tables", block_tables, (num_seqs, None))
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    if num_heads % num_kv_heads != 0:
        raise KernelArgumentError(
            f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})"
        )
    check_dtype("query", query, FLOAT_DTYPES)
    check_same_dtype(key_cache=key_cache, value_cache=value_cache)
    for name, t in (("block_tables", block_tables), ("query_start_loc", query_start_loc),
                    ("seq_lens", seq_lens)):
        check_dtype(name, t, INDEX_DTYPES)
    check_same_device(query=query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, query_start_loc=query_start_loc,
                      seq_lens=seq_lens)
    check_contiguous("key_cache", key_cache)
    check_contiguous("value_cache", value_cache)
    check_last_dim_contiguous("query", query)
    check_last_dim_contiguous("block_tables", block_tables)
    if out is not None:
        check_shape("out", out, tuple(query.shape))
        check_same_device(query=query, out=out)
        check_last_dim_contiguous("out", out)


def check_attention_options(sliding_window: object, softcap: object) -> None:
    """Reject a window or softcap the kernels would misread.

    Both are host values on purpose: the Triton path turns them into launch arguments, so
    they must not live on the device (reading one back would synchronise and break CUDA
    graph capture). ``bool`` is refused although it is an ``int`` (``True`` as a window of
    one token is surely a mistake), as are a non-positive window and a softcap that is not
    a positive finite number (``tanh(s / c)`` is undefined at 0 and meaningless at inf).
    """
    if sliding_window is not None and (
        not isinstance(sliding_window, int) or isinstance(sliding_window, bool)
        or sliding_window < 1
    ):
        raise KernelArgumentError(
            f"sliding_window must be a positive int or None, got {sliding_window!r}"
        )
    if softcap is not None and (
        not isinstance(softcap, (int, float)) or isinstance(softcap, bool)
        or not math.isfinite(softcap) or softcap <= 0
    ):
        raise KernelArgumentError(
            f"softcap must be a positive finite float or None, got {softcap!r}"
        )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context.

    - ``query``: ``[num_tokens, num_heads, head_size]``, the sequences' new tokens back to
      back (no padding); ``query_start_loc`` (``[num_seqs + 1]``) gives their offsets.
    - ``key_cache``/``value_cache``: ``[num_blocks, block_size, num_kv_heads, head_size]``;
      the new tokens' K/V must already be stored (see ``store_kv_cache``). A quantized
      cache (int8 or float8_e4m3fn, last dimension ``head_size + 1``, blocks laid out as
      ``kv_quant`` says) is dequantized as it is read.
    - ``block_tables``: ``[num_seqs, max_blocks]``; entries past a sequence's last block
      are never read. ``seq_lens``: ``[num_seqs]``, each context length including the new
      tokens, so new token ``j`` of a sequence with ``q`` new tokens sits at position
      ``seq_len - q + j`` and sees keys ``0..seq_len - q + j``.
    - ``max_query_len``/``max_seq_len``: host-side upper bounds, so the GPU path needs no
      device-to-host sync (and can run inside a CUDA graph); computed when omitted.
    - ``sliding_window`` W (Gemma 2/3, Mistral with a window, Phi-3): the token at position
      ``p`` sees only keys ``p - W < k <= p``, its last W tokens (transformers' rule). The
      engine may then free every block lying wholly before all of a sequence's windows and
      point its table entries at a placeholder block (any valid id, contents garbage, even
      NaN): such blocks are never read, so nothing outside a window reaches the result.
    - ``softcap`` c (Gemma 2): each score ``s = scale * q.k`` becomes ``c * tanh(s / c)``
      before the mask and softmax.

    Both default to None (plain causal attention, unchanged), and both are host values,
    like the bounds. Returns ``out`` (allocated when not given), shaped like ``query``.
    """
    check_paged_attention_args(query, key_cache, value_cache, block_tables, query_start_loc,
                               seq_lens, out)
    check_attention_options(sliding_window, softcap)
    softcap = None if softcap is None else float(softcap)
    if query.shape[0] == 0:
        return out if out is not None else torch.empty_like(query)
    if select_backend(query.device) == "triton":
        from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton

        if query.shape[2] not in SUPPORTED_HEAD_SIZES:
            raise KernelArgumentError(
                f"head size {query.shape[2]} is not supported by the Triton kernel "
                f"(supported: {SUPPORTED_HEAD_SIZES})"
            )
        return paged_attention_triton(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
            max_query_len=max_query_len, max_seq_len=max_seq_len, out=out,
            sliding_window=sliding_window, softcap=softcap,
        )
    if query.device.type == "cpu" and cpu_kernels_allowed():
        from kvrelay_kernels.cpu_kernels.paged_attention import paged_attention_cpu_dispatch

        return paged_attention_cpu_dispatch(
            query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
            out=out, sliding_window=sliding_window, softcap=softcap,
        )
    return paged_attention_reference(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale, out=out,
        sliding_window=sliding_window, softcap=softcap,
    )
