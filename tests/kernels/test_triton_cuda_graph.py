"""The compiled kernels inside CUDA graph capture, as the engine's decode graphs use them.

Capture fails on any device-to-host synchronisation, so a capture that succeeds shows the
launch path reads no device value; replaying after changing the inputs in place shows the
grid and workspace fit every batch the bounds allow.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from attention_cases import TOLERANCES, PagedBatch, make_batch

import kvrelay_kernels
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MAX_MODEL_LEN = 8192


def _capture(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _load(static: PagedBatch, batch: PagedBatch) -> None:
    """Copy ``batch`` into the captured tensors (same shapes), as the engine does."""
    for dst, src in zip(static.args(), batch.args(), strict=True):
        dst.copy_(src)


@pytest.mark.parametrize(
    ("query_lens", "seq_lens_a", "seq_lens_b", "max_query_len", "options"),
    [
        ([1, 1, 1, 1], [1, 17, 300, 5000], [4100, 64, 2, 33], 1, {}),  # decode graph
        ([1, 12, 1, 30], [30, 200, 4000, 30], [7, 12, 900, 1000], 32, {}),  # mixed graph
        # Gemma-2-like layers: window and softcap are host values, fixed at capture.
        ([1, 1, 1, 1], [1, 17, 300, 5000], [4100, 64, 2, 33], 1,
         {"sliding_window": 1000, "softcap": 50.0}),
        ([1, 12, 1, 30], [30, 200, 4000, 30], [7, 12, 900, 1000], 32,
         {"sliding_window": 100, "softcap": 50.0}),
    ],
    ids=["decode", "mixed", "decode-window-softcap", "mixed-window-softcap"],
)
def test_attention_replays_with_new_lengths(query_lens, seq_lens_a, seq_lens_b, max_query_len,
                                            options):
    block_size = 16
    sizes = {"num_blocks": 2 * MAX_MODEL_LEN // block_size,
             "table_width": MAX_MODEL_LEN // block_size}
    shape = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128, "block_size": block_size,
             "dtype": torch.bfloat16, "device": "cuda"}
    static, _ = make_batch(query_lens, seq_lens_a, **shape, **sizes)
    out = torch.zeros_like(static.query)

    def step() -> None:
        kvrelay_kernels.paged_attention(*static.args(), 128**-0.5, max_query_len=max_query_len,
                                        max_seq_len=MAX_MODEL_LEN, out=out, **options)

    graph = _capture(step)
    for lens in (seq_lens_a, seq_lens_b):
        clean, poisoned = make_batch(query_lens, lens, **shape, **sizes)
        _load(static, poisoned)
        graph.replay()
        expected = paged_attention_reference(*clean.args(), 128**-0.5, **options)
        atol, rtol = TOLERANCES[torch.bfloat16]
        torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol)


def test_decode_layer_kernels_capture_together():
    """Norm, rotary, store and attention of one decode step in one graph."""
    tokens, heads, kv_heads, head = 8, 32, 8, 128
    hidden = heads * head
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    qkv = torch.randn(tokens, hidden + 2 * kv_heads * head, device="cuda", dtype=torch.bfloat16)
    positions = torch.arange(tokens, device="cuda") * 100
    table = torch.randn(MAX_MODEL_LEN, 128, device="cuda")
    cache = torch.zeros(64, 16, kv_heads, head, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(cache)
    slots = torch.arange(tokens, device="cuda") * 16 + 3
    slots[-1] = -1
    block_tables = torch.arange(tokens, device="cuda", dtype=torch.int32)[:, None]
    starts = torch.arange(tokens + 1, device="cuda", dtype=torch.int32)
    seq_lens = torch.full((tokens,), 4, device="cuda", dtype=torch.int32)
    out = torch.empty(tokens, heads, head, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        normed, _ = kvrelay_kernels.fused_add_rms_norm(x, residual, weight, 1e-6)
        kvrelay_kernels.rms_norm(normed, weight, 1e-6)
        q = qkv[:, :hidden]
        k = qkv[:, hidden : hidden + kv_heads * head]
        v = qkv[:, hidden + kv_heads * head :]
        kvrelay_kernels.rotary_embedding(positions, q, k, table, head)
        kvrelay_kernels.store_kv_cache(k.view(tokens, kv_heads, head),
                                       v.view(tokens, kv_heads, head), cache, v_cache, slots)
        kvrelay_kernels.paged_attention(q.view(tokens, heads, head), cache, v_cache,
                                        block_tables, starts, seq_lens, head**-0.5,
                                        max_query_len=1, max_seq_len=MAX_MODEL_LEN, out=out)

    graph = _capture(step)
    graph.replay()
    torch.cuda.synchronize()
    assert not out[:-1].isnan().any()
