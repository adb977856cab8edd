"""The Triton paged-attention kernels against the plain-PyTorch reference.

Sliding-window cases also free, as the engine does, every block no window reaches (NaN,
their table entries at a shared NaN placeholder), on top of the usual poisoning: a kernel
that loads such a block, even to mask it, returns NaN.
"""

from __future__ import annotations

import random

import pytest
import torch
from attention_cases import TOLERANCES, free_outside_window, make_batch

from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels import launch_config
from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton


def _check(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    scale: float | None = None,
) -> None:
    clean, poisoned = make_batch(query_lens, seq_lens, num_heads=num_heads,
                                 num_kv_heads=num_kv_heads, head_size=head_size,
                                 block_size=block_size, dtype=dtype, device=device)
    if sliding_window is not None:
        poisoned, _ = free_outside_window(poisoned, sliding_window)
    scale = head_size**-0.5 if scale is None else scale
    options = {"sliding_window": sliding_window, "softcap": softcap}
    expected = paged_attention_reference(*clean.args(), scale, **options)
    got = paged_attention_triton(*poisoned.args(), scale, max_query_len=max_query_len,
                                 max_seq_len=max_seq_len, **options)
    assert got.dtype == dtype
    assert not got.isnan().any(), "the kernel read a slot or block it must not read"
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


# (num_heads, num_kv_heads, head_size, block_size, dtype): GQA 4 and 8, MHA, MQA, every
# head size, both block sizes and every dtype, without the full cartesian product.
SHAPES = [
    pytest.param(8, 2, 64, 16, torch.float32, id="gqa4-d64-b16-fp32"),
    pytest.param(8, 1, 80, 32, torch.bfloat16, id="mqa8-d80-b32-bf16"),
    pytest.param(4, 4, 96, 16, torch.float16, id="mha-d96-b16-fp16"),
    pytest.param(16, 2, 128, 32, torch.bfloat16, id="gqa8-d128-b32-bf16"),
    pytest.param(4, 1, 128, 16, torch.float16, id="mqa4-d128-b16-fp16"),
    # Gemma 2/3's head size, under a window and soft-cap as Gemma runs it.
    pytest.param(4, 2, 256, 16, torch.bfloat16, id="gqa2-d256-b16-bf16"),
    # SmolLM2-135M (the default model): 9 query heads over 3 KV heads, a group of 3.
    pytest.param(9, 3, 64, 16, torch.float32, id="gqa3-d64-b16-fp32"),
    pytest.param(14, 2, 64, 32, torch.bfloat16, id="gqa7-d64-b32-bf16"),
]


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_size", "block_size", "dtype"),
                         SHAPES)
def test_decode_batch(num_heads, num_kv_heads, head_size, block_size, dtype, device):
    # Context 1, a partial last block, exactly one block, and several tiles.
    seq_lens = [1, block_size + 3, block_size, 150]
    _check([1] * len(seq_lens), seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
           head_size=head_size, block_size=block_size, dtype=dtype, device=device)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_size", "block_size", "dtype"),
                         SHAPES)
def test_mixed_batch(num_heads, num_kv_heads, head_size, block_size, dtype, device):
    # Decode, a chunk after a cached prefix, a fresh prefill, a one-token prompt, decode.
    query_lens = [1, 19, 37, 1, 1]
    seq_lens = [70, 19 + 45, 37, 1, 33]
    _check(query_lens, seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
           head_size=head_size, block_size=block_size, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ("query_lens", "seq_lens"),
    [([150, 3], [200, 3]), ([130], [130]), ([70], [300])],
    ids=["two-seqs", "one-fresh-prompt", "one-chunk-after-prefix"],
)
def test_prefill_longer_than_one_query_tile(query_lens, seq_lens, device):
    # MHA: 64 query tokens per program, so these prompts span two or three tiles.
    _check(query_lens, seq_lens, num_heads=2, num_kv_heads=2, head_size=64, block_size=16,
           dtype=torch.float32, device=device)


def test_decode_long_context_uses_several_splits(device):
    seq_lens = [700, 1000]
    splits = launch_config.choose_num_splits(
        len(seq_lens), 2, max(seq_lens), 64, launch_config.sm_count(torch.device(device)))
    assert splits > 1
    _check([1, 1], seq_lens, num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
           dtype=torch.bfloat16, device=device)


def test_decode_with_one_split_writes_the_output_directly(device, monkeypatch):
    monkeypatch.setattr(launch_config, "DECODE_MAX_SPLITS", 1)
    _check([1, 1], [700, 65], num_heads=8, num_kv_heads=2, head_size=128, block_size=32,
           dtype=torch.float16, device=device)


def test_decode_split_count_from_batch_shape():
    cfg = launch_config.choose_num_splits
    # A single sequence on a big GPU spreads over many splits, a large batch needs none,
    # and a short context is never cut finer than one tile per split.
    assert cfg(1, 8, 32768, 64, 132) == launch_config.DECODE_MAX_SPLITS
    assert cfg(256, 8, 32768, 64, 132) == 1
    assert cfg(1, 8, 100, 64, 132) == 2


def test_decode_cuda_graph_style_bounds(device):
    # The engine's graphs pass max_model_len: most splits then lie past every context and
    # must exit, and the reduce must skip them.
    _check([1, 1, 1], [1, 40, 130], num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
           dtype=torch.float16, device=device, max_query_len=1, max_seq_len=8192)


def test_mixed_cuda_graph_style_bounds(device):
    _check([1, 9, 1], [30, 40, 1], num_heads=8, num_kv_heads=2, head_size=64, block_size=32,
           dtype=torch.float32, device=device, max_query_len=64, max_seq_len=8192)


def test_decode_skips_padding_sequences_and_honours_out(device):
    # A padded graph batch: sequence 1 has no new token; its row of ``out`` is untouched.
    clean, poisoned = make_batch([1, 1, 1], [20, 5, 90], num_heads=4, num_kv_heads=2,
                                 head_size=64, block_size=16, dtype=torch.float32,
                                 device=device)
    starts = torch.tensor([0, 1, 1, 2], dtype=torch.int32, device=device)
    query = poisoned.query[:2]
    expected = paged_attention_reference(query, clean.key_cache, clean.value_cache,
                                         clean.block_tables[[0, 2]], starts[[0, 1, 3]],
                                         clean.seq_lens[[0, 2]], 0.125)
    out = torch.full((2, 4, 64), 7.0, device=device)
    got = paged_attention_triton(query, poisoned.key_cache, poisoned.value_cache,
                                 poisoned.block_tables, starts, poisoned.seq_lens, 0.125,
                                 max_query_len=1, max_seq_len=4096, out=out)
    assert got is out
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("query_lens", [[1, 1], [1, 5]], ids=["decode", "mixed"])
def test_int64_index_tensors(query_lens, device):
    clean, poisoned = make_batch(query_lens, [40, 90], num_heads=4, num_kv_heads=2,
                                 head_size=64, block_size=16, dtype=torch.float32,
                                 device=device)
    for batch in (clean, poisoned):
        batch.block_tables = batch.block_tables.long()
        batch.query_start_loc = batch.query_start_loc.long()
        batch.seq_lens = batch.seq_lens.long()
    expected = paged_attention_reference(*clean.args(), 0.125)
    got = paged_attention_triton(*poisoned.args(), 0.125)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_strided_query_and_out(device):
    clean, poisoned = make_batch([4, 1], [10, 33], num_heads=4, num_kv_heads=2, head_size=64,
                                 block_size=16, dtype=torch.float32, device=device)
    wide = torch.randn(5, 6, 64, device=device)
    wide[:, 1:5] = poisoned.query
    query = wide[:, 1:5]  # rows strided by 6 heads
    out_wide = torch.zeros(5, 4, 128, device=device)
    out = out_wide[..., :64]
    expected = paged_attention_reference(*clean.args(), 0.125)
    paged_attention_triton(query, *poisoned.args()[1:], 0.125, out=out)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    assert (out_wide[..., 64:] == 0).all()


@pytest.mark.parametrize("seed", range(6))
def test_random_batches(seed, device):
    """Random mixes of shapes, lengths and bounds, beyond the hand-picked cases."""
    rng = random.Random(seed)
    num_kv_heads, group = rng.choice([1, 2, 3]), rng.choice([1, 2, 3, 4, 5, 8])
    decode_only = rng.random() < 0.4
    query_lens, seq_lens = [], []
    for _ in range(rng.randint(1, 5)):
        query_len = 1 if decode_only else rng.choice([1, 1, 2, 17, 70])
        query_lens.append(query_len)
        seq_lens.append(query_len + rng.choice([0, 1, 15, 16, 33, 300]))
    _check(query_lens, seq_lens, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
           head_size=rng.choice([64, 80, 96, 128]), block_size=rng.choice([16, 32]),
           dtype=rng.choice([torch.float32, torch.float16, torch.bfloat16]), device=device,
           max_query_len=rng.choice([None, max(query_lens) + 3]),
           max_seq_len=rng.choice([None, 4096]))


# Windows of one token, below a block, not a multiple of the block or tile size, and at or
# beyond the longest context (nothing to cut); contexts span several tiles and splits.
WINDOW_SHAPES = [
    pytest.param(8, 2, 64, 16, torch.float32, id="gqa4-d64-b16-fp32"),
    pytest.param(9, 3, 64, 16, torch.float32, id="gqa3-d64-b16-fp32"),
    pytest.param(8, 1, 80, 32, torch.bfloat16, id="gqa8-d80-b32-bf16"),
    pytest.param(4, 4, 96, 16, torch.float16, id="mha-d96-b16-fp16"),
    pytest.param(4, 2, 256, 16, torch.bfloat16, id="gqa2-d256-b16-bf16"),  # Gemma's
]


@pytest.mark.parametrize("window", [1, 5, 37, 150, 1000])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_size", "block_size", "dtype"),
                         WINDOW_SHAPES[:2])
def test_decode_batch_with_window(num_heads, num_kv_heads, head_size, block_size, dtype,
                                  window, device):
    _check([1] * 5, [1, block_size + 3, 37, 150, 301], num_heads=num_heads,
           num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
           dtype=dtype, device=device, sliding_window=window)


@pytest.mark.parametrize(("shape", "window"), [
    (WINDOW_SHAPES[0], 5), (WINDOW_SHAPES[1], 37), (WINDOW_SHAPES[0], 150),
], ids=["gqa4-5", "gqa3-37", "gqa4-150"])
def test_mixed_batch_with_window(shape, window, device):
    num_heads, num_kv_heads, head_size, block_size, dtype = shape.values
    _check([1, 19, 37, 1, 1, 5], [70, 19 + 45, 37, 1, 150, 5 + 3], num_heads=num_heads,
           num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
           dtype=dtype, device=device, sliding_window=window)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_size", "block_size", "dtype"),
                         WINDOW_SHAPES[2:])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 20, 1]], ids=["decode", "mixed"])
def test_window_and_softcap_in_16_bit(num_heads, num_kv_heads, head_size, block_size, dtype,
                                      query_lens, device):
    _check(query_lens, [130, 20 + 77, 9], num_heads=num_heads, num_kv_heads=num_kv_heads,
           head_size=head_size, block_size=block_size, dtype=dtype, device=device,
           sliding_window=21, softcap=2.0, scale=0.3)


@pytest.mark.parametrize("window", [3, 40])
def test_prefill_with_window_across_query_and_context_tiles(window, device):
    # MHA: 64 query tokens per program and 32-token context tiles (float32), so later
    # programs start past key 0 and, under the small window, a row can see no key of a
    # whole context tile (the -inf running max must not become NaN).
    _check([150, 3], [200, 3], num_heads=2, num_kv_heads=2, head_size=64, block_size=16,
           dtype=torch.float32, device=device, sliding_window=window)


def test_decode_window_over_several_splits(device):
    # The splits cut the window span [seq_len - window, seq_len), not the whole context;
    # the split count comes from the window (host side), the span per sequence on device.
    window = 200
    splits = launch_config.choose_num_splits(2, 2, window, 64,
                                             launch_config.sm_count(torch.device(device)))
    assert splits > 1
    _check([1, 1, 1], [700, 1000, 90], num_heads=8, num_kv_heads=2, head_size=64,
           block_size=16, dtype=torch.bfloat16, device=device, sliding_window=window)


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 9, 1]], ids=["decode", "mixed"])
def test_window_with_cuda_graph_style_bounds(query_lens, device):
    _check(query_lens, [1, 40 + 9, 130], num_heads=8, num_kv_heads=2, head_size=64,
           block_size=16, dtype=torch.float32, device=device, max_query_len=64,
           max_seq_len=8192, sliding_window=17, softcap=3.0)


@pytest.mark.parametrize(("query_lens", "num_heads", "num_kv_heads", "window"), [
    ([1, 1, 1, 1], 9, 3, None),
    ([1, 1, 1, 1], 8, 1, 13),
    ([1, 19, 37, 1], 9, 3, 13),
    ([1, 19, 37, 1], 8, 1, None),
], ids=["decode-gqa3", "decode-gqa8-window", "mixed-gqa3-window", "mixed-gqa8"])
def test_softcap(query_lens, num_heads, num_kv_heads, window, device):
    # (MHA: test_window_and_softcap_in_16_bit.)
    # A low cap and a large scale so that tanh bends most scores.
    _check(query_lens, [70, 19 + 45, 37, 1], num_heads=num_heads, num_kv_heads=num_kv_heads,
           head_size=64, block_size=16, dtype=torch.float32, device=device,
           sliding_window=window, softcap=1.5, scale=0.3)
