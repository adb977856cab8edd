"""Sliding window and logit soft-capping in the paged-attention reference, against a naive
dense oracle (``attention_cases.dense_attention``), and their argument checks.

The reference is the Triton kernels' oracle, so it is itself checked here against the
plainest possible computation: decode batches, prefill and chunked queries mixed in one
call, odd contexts and partial last blocks, shuffled block tables, GQA groups of 1, 3 and
8, windows below, at and above the contexts and not multiples of the block size. Freed
blocks (NaN, their table entries at one shared NaN placeholder) must not reach the output.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import TOLERANCES, dense_attention, free_outside_window, make_batch

import kvrelay_kernels
from kvrelay_kernels import KernelArgumentError
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

BLOCK = 8
# Decode only, and decode mixed with chunks after a prefix, fresh prompts and a one-token
# prompt; odd contexts, partial last blocks, a context of exactly one block.
BATCHES = {
    "decode": ([1, 1, 1, 1, 1], [1, 29, 8, 40, 17]),
    "mixed": ([1, 7, 1, 3, 12, 1], [1, 7 + 20, 40, 3, 12 + 5, 33]),
}
# (num_heads, num_kv_heads): GQA groups of 1, 3 and 8.
HEADS = [pytest.param(2, 2, id="mha"), pytest.param(6, 2, id="gqa3"),
         pytest.param(8, 1, id="gqa8")]
# Below a block, not a multiple of it, exactly two blocks, the longest context, beyond.
WINDOWS = [1, 5, 13, 16, 40, 1000]


def _batch(kind: str, num_heads: int, num_kv_heads: int, dtype: torch.dtype = torch.float32):
    query_lens, seq_lens = BATCHES[kind]
    clean, _ = make_batch(query_lens, seq_lens, num_heads=num_heads,
                          num_kv_heads=num_kv_heads, head_size=32, block_size=BLOCK,
                          dtype=dtype, device="cpu")
    return clean


def _assert_matches(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.isfinite().all(), "a key outside the window reached the output"
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("kind", BATCHES)
def test_window_matches_dense_oracle(kind, num_heads, num_kv_heads, window):
    batch = _batch(kind, num_heads, num_kv_heads)
    got = paged_attention_reference(*batch.args(), 0.3, sliding_window=window)
    _assert_matches(got, dense_attention(batch, 0.3, sliding_window=window), torch.float32)


def test_window_changes_the_result():
    # The window must actually cut something in these cases (else the oracle test above
    # could pass with the option ignored), and one at least as long as every context not.
    batch = _batch("mixed", 6, 2)
    full = paged_attention_reference(*batch.args(), 0.3)
    windowed = paged_attention_reference(*batch.args(), 0.3, sliding_window=13)
    assert not torch.allclose(full, windowed, atol=1e-3)
    wide = paged_attention_reference(*batch.args(), 0.3, sliding_window=40)
    torch.testing.assert_close(wide, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [1, 5, 13])
@pytest.mark.parametrize("kind", BATCHES)
def test_freed_blocks_never_reach_the_output(kind, window):
    batch = _batch(kind, 6, 2)
    freed, n_freed = free_outside_window(batch, window)
    assert n_freed > 0
    got = paged_attention_reference(*freed.args(), 0.3, sliding_window=window)
    _assert_matches(got, dense_attention(batch, 0.3, sliding_window=window), torch.float32)


@pytest.mark.parametrize("window", [None, 5, 13])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("kind", BATCHES)
def test_softcap_matches_dense_oracle(kind, num_heads, num_kv_heads, window):
    batch = freed = _batch(kind, num_heads, num_kv_heads)
    if window is not None:
        freed, _ = free_outside_window(batch, window)
    got = paged_attention_reference(*freed.args(), 0.3, sliding_window=window, softcap=1.5)
    expected = dense_attention(batch, 0.3, sliding_window=window, softcap=1.5)
    _assert_matches(got, expected, torch.float32)
    # A cap this low must matter, or the comparison shows nothing.
    uncapped = dense_attention(batch, 0.3, sliding_window=window)
    assert not torch.allclose(expected, uncapped, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_softcap_and_window_in_16_bit(dtype):
    batch = _batch("mixed", 6, 2, dtype)
    freed, _ = free_outside_window(batch, 13)
    got = paged_attention_reference(*freed.args(), 0.3, sliding_window=13, softcap=1.5)
    assert got.dtype == dtype
    _assert_matches(got, dense_attention(batch, 0.3, sliding_window=13, softcap=1.5), dtype)


def test_public_entry_passes_the_options_on():
    batch = _batch("mixed", 6, 2)
    freed, _ = free_outside_window(batch, 5)
    got = kvrelay_kernels.paged_attention(*freed.args(), scale=0.3, sliding_window=5,
                                          softcap=2)  # an int cap is accepted
    _assert_matches(got, dense_attention(batch, 0.3, sliding_window=5, softcap=2.0),
                    torch.float32)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sliding_window": 0}, "sliding_window must be a positive int"),
        ({"sliding_window": -4}, "sliding_window must be a positive int"),
        ({"sliding_window": 4.0}, "sliding_window must be a positive int"),
        ({"sliding_window": True}, "sliding_window must be a positive int"),
        ({"sliding_window": torch.tensor(4)}, "sliding_window must be a positive int"),
        ({"softcap": 0.0}, "softcap must be a positive finite float"),
        ({"softcap": -30.0}, "softcap must be a positive finite float"),
        ({"softcap": float("inf")}, "softcap must be a positive finite float"),
        ({"softcap": float("nan")}, "softcap must be a positive finite float"),
        ({"softcap": True}, "softcap must be a positive finite float"),
        ({"softcap": "50"}, "softcap must be a positive finite float"),
    ],
)
def test_bad_options_are_refused(options, message):
    batch = _batch("mixed", 6, 2)
    with pytest.raises(KernelArgumentError, match=message):
        kvrelay_kernels.paged_attention(*batch.args(), scale=0.3, **options)
