"""The compiled CPU paged-attention kernels against the PyTorch reference and the dense oracle.

The kernels read K/V straight from the blocks a table names, so every case runs them on
the ``poisoned`` batch (NaN in every slot and table entry past a sequence's context): a
stray read turns the output into NaN. Cases: decode batches of mixed, odd lengths with
partial last blocks, shuffled block tables, GQA groups of 1, 3 and 8, head sizes
64/128/256; the tiled kernel on queries of 1, 5, 17, 64 and 300 tokens, fresh and after
a prefix (context before the query), through sgemm and through its fallback loops;
sliding windows (with freed placeholder blocks) and softcap, 16-bit caches, strided
views, int64 index tensors, and batches that mix decodes with prompt chunks.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import pytest
import torch
from attention_cases import TOLERANCES, dense_attention, free_outside_window, make_batch

import kvrelay_kernels
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.cpu_kernels.paged_attention import (
    as_int32,
    cpu_kernel_usable,
    paged_attention_cpu,
    paged_attention_decode_cpu,
    paged_attention_tiled_cpu,
    parallel_team_size,
    set_tiled_blas,
)
from kvrelay_kernels.reference.paged_attention import paged_attention_reference

BLOCK = 16
DECODE = ([1] * 7, [1, 29, 8, 40, 17, 16, 131])
# Decodes (decode kernel) beside short and longer queries (tiled kernel), in one call.
MIXED = ([1, 7, 2, 3, 12, 1, 4], [1, 7 + 20, 40, 3, 12 + 5, 33, 4 + 50])
# Prompt chunks: query lengths across the tiled kernel's 32-token query tiles, with odd
# contexts before them (a prefix-cache hit or an earlier chunk) or none (fresh prefill).
CHUNK_LENS = [1, 5, 17, 64, 300]
PREFIX = (CHUNK_LENS, [n + c for n, c in zip(CHUNK_LENS, [37, 29, 3, 100, 131])])
FRESH = (CHUNK_LENS, list(CHUNK_LENS))
HEADS = [pytest.param(2, 2, id="mha"), pytest.param(6, 2, id="gqa3"),
         pytest.param(8, 1, id="gqa8")]
# torch's build helper uses $CXX, else c++.
HAS_COMPILER = shutil.which("c++") is not None or shutil.which("g++") is not None


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVRELAY_KERNELS", raising=False)


def _batches(lens: tuple[list[int], list[int]], num_heads: int, num_kv_heads: int,
             head_size: int = 64, dtype: torch.dtype = torch.float32):
    query_lens, seq_lens = lens
    return make_batch(query_lens, seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                      head_size=head_size, block_size=BLOCK, dtype=dtype, device="cpu")


def _assert_close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.isfinite().all(), "the kernel read a slot outside a context"
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.double(), expected.double(), atol=atol, rtol=rtol)


def test_the_kernel_builds_where_a_compiler_is():
    # The CI machine has gcc: there the compiled path must be the one that runs.
    assert load_cpu_kernels() is HAS_COMPILER


needs_kernel = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler on this machine")


@needs_kernel
@pytest.mark.parametrize("lens", [DECODE, MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_kernels_match_reference(num_heads, num_kv_heads, head_size, lens):
    clean, poisoned = _batches(lens, num_heads, num_kv_heads, head_size)
    expected = paged_attention_reference(*clean.args(), 0.125)
    out = torch.full_like(poisoned.query, float("nan"))
    paged_attention_cpu(*poisoned.args(), 0.125, out, sliding_window=None, softcap=None)
    _assert_close(out, expected, torch.float32)


@needs_kernel
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_mixed_batch_through_the_public_entry(num_heads, num_kv_heads):
    clean, poisoned = _batches(MIXED, num_heads, num_kv_heads)
    expected = paged_attention_reference(*clean.args(), 0.3)
    _assert_close(kvrelay_kernels.paged_attention(*poisoned.args(), 0.3), expected,
                  torch.float32)


@pytest.fixture(params=[(True, 1), (True, 3), (False, 2)],
                ids=["sgemm", "sgemm-3-threads", "loops"])
def tile_products(request: pytest.FixtureRequest) -> Iterator[None]:
    """Runs a test with the tiled kernel's products in sgemm (one worker, then three workers
    each with a one-thread MKL team), then in its fallback loops."""
    blas, num_threads = request.param
    if not load_cpu_kernels():
        pytest.skip("no C++ compiler on this machine")
    if set_tiled_blas(blas) != blas:
        pytest.skip("this torch links no sgemm: only the loops exist")
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    yield
    torch.set_num_threads(threads)
    set_tiled_blas(True)


@needs_kernel
@pytest.mark.skipif(sys.platform != "linux", reason="OpenMP builds are Linux-only")
def test_kernels_run_on_torchs_threads():
    # ATen's parallel_for is a header template: in a library compiled without OpenMP it runs
    # serially whatever torch.set_num_threads says (the kernels once did, unnoticed).
    assert load_cpu_kernels()
    threads = torch.get_num_threads()
    try:
        for wanted in (1, 3):
            torch.set_num_threads(wanted)
            assert parallel_team_size() == wanted
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("lens", [PREFIX, FRESH], ids=["prefix", "fresh"])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_tiled_kernel_matches_reference(lens, num_heads, num_kv_heads, tile_products):
    # min_query_len=1: the one-token query goes through the tiled kernel too.
    clean, poisoned = _batches(lens, num_heads, num_kv_heads)
    expected = paged_attention_reference(*clean.args(), 0.125)
    out = torch.full_like(poisoned.query, float("nan"))
    paged_attention_tiled_cpu(*poisoned.args(), 0.125, out, sliding_window=None, softcap=None,
                              min_query_len=1)
    _assert_close(out, expected, torch.float32)


@needs_kernel
def test_each_kernel_serves_only_its_own_queries():
    # The split is real: the decode kernel writes one-token queries' rows only and the
    # tiled kernel the others', so neither silently computes (or skips) the other's share.
    _, poisoned = _batches(MIXED, 6, 2)
    sentinel = 123.0
    decode_out = torch.full_like(poisoned.query, sentinel)
    tiled_out = torch.full_like(poisoned.query, sentinel)
    options = {"sliding_window": None, "softcap": None}
    paged_attention_decode_cpu(*poisoned.args(), 0.3, decode_out, **options)
    paged_attention_tiled_cpu(*poisoned.args(), 0.3, tiled_out, **options)
    starts = poisoned.query_start_loc.tolist()
    for i, n in enumerate(MIXED[0]):
        mine, other = (decode_out, tiled_out) if n == 1 else (tiled_out, decode_out)
        rows = slice(starts[i], starts[i + 1])
        assert mine[rows].isfinite().all()
        assert (mine[rows] != sentinel).all()
        assert (other[rows] == sentinel).all()


@needs_kernel
def test_int64_index_tensors_and_no_copy_of_int32_ones():
    # Public callers may pass int64 indices; the engine's int32 metadata is used as is.
    clean, poisoned = _batches(MIXED, 6, 2)
    wide = [t.long() for t in poisoned.args()[3:]]
    got = kvrelay_kernels.paged_attention(*poisoned.args()[:3], *wide, 0.3)
    _assert_close(got, paged_attention_reference(*clean.args(), 0.3), torch.float32)
    for index in poisoned.args()[3:]:
        assert as_int32(index) is index


@needs_kernel
@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("window", [1, 5, 13, 16, 40, 1000])
@pytest.mark.parametrize("lens", [DECODE, MIXED, PREFIX], ids=["decode", "mixed", "prefix"])
def test_window_and_softcap_match_dense_oracle(lens, window, softcap):
    batch, _ = _batches(lens, 6, 2)
    freed, _ = free_outside_window(batch, window)
    got = kvrelay_kernels.paged_attention(*freed.args(), 0.3, sliding_window=window,
                                          softcap=softcap)
    expected = dense_attention(batch, 0.3, sliding_window=window, softcap=softcap)
    _assert_close(got, expected, torch.float32)


@needs_kernel
@pytest.mark.parametrize("lens", [MIXED, PREFIX], ids=["mixed", "prefix"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_16_bit_caches(dtype, lens):
    clean, poisoned = _batches(lens, 8, 1, dtype=dtype)
    got = kvrelay_kernels.paged_attention(*poisoned.args(), 0.3, softcap=20.0)
    assert got.dtype == dtype
    _assert_close(got, dense_attention(clean, 0.3, softcap=20.0), dtype)


@needs_kernel
@pytest.mark.parametrize("lens", [DECODE, MIXED], ids=["decode", "mixed"])
def test_strided_query_and_output(lens):
    # The engine's q is a view into the fused qkv projection: rows are strided.
    clean, poisoned = _batches(lens, 6, 2)
    wide = torch.randn(poisoned.query.shape[0], 10, 64)
    wide[:, 2:8] = poisoned.query
    out = torch.zeros(poisoned.query.shape[0], 9, 64)
    got = kvrelay_kernels.paged_attention(wide[:, 2:8], *poisoned.args()[1:], 0.125,
                                          out=out[:, 1:7])
    _assert_close(got, paged_attention_reference(*clean.args(), 0.125), torch.float32)
    assert (out[:, 0] == 0).all()
    assert (out[:, 7:] == 0).all()


def test_reference_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch):
    # KVRELAY_KERNELS=reference is the fallback of a machine without a compiler.
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiled kernel ran although the reference was forced")

    monkeypatch.setattr("kvrelay_kernels.cpu_kernels.paged_attention.paged_attention_cpu",
                        refuse)
    clean, _ = _batches(MIXED, 6, 2)  # the reference reads padding: no poison for it
    got = kvrelay_kernels.paged_attention(*clean.args(), 0.3)
    _assert_close(got, dense_attention(clean, 0.3), torch.float32)


def test_unsupported_dtype_mix_takes_the_reference():
    clean, _ = _batches(DECODE, 6, 2)
    assert not cpu_kernel_usable(clean.query.double(), clean.key_cache)
    out = torch.empty_like(clean.query, dtype=torch.float64)
    got = kvrelay_kernels.paged_attention(*clean.args(), 0.3, out=out)
    _assert_close(got, dense_attention(clean, 0.3), torch.float32)
