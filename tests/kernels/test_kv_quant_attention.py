"""The quantized KV cache (int8 and float8 e4m3 rows with a power-of-two scale byte, in
blocks of aligned value rows followed by a scale tail): store and paged attention,
reference and Triton (interpreted on CPU), decode and prefill.

Tolerances, derived from the quantization step rather than tuned:

- Element error. A row's scale is ``2**e``; int8 rounds ``x / 2**e`` to an integer, so
  ``|x - x'| <= 2**e / 2``; e4m3 keeps 3 mantissa bits (relative error ``<= 2**-4``) down
  to its subnormals (step ``2**-9``, error ``<= 2**(e - 10)``). Checked element by element.
- Attention error. With each key perturbed by ``dk``, a score moves by at most
  ``E = scale * max_j sum_d |q_d| |dk_jd|``; the softmax weights then move by a factor in
  ``[exp(-2E), exp(2E)]``, so ``sum_j |p'_j - p_j| <= exp(2E) - 1``, and the output
  ``sum_j p_j v_j`` moves by at most ``(exp(2E) - 1) max|v| + max|dv|``. The test computes
  that bound from the batch's own steps and checks every output element against it.
- Kernel error. Reading a quantized cache must equal reading its dequantized copy: the
  reference against itself on the dequantized floats at float32 tolerance, Triton against
  the reference at the usual per-dtype tolerances.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from attention_cases import QUANT_DTYPES, TOLERANCES, PagedBatch, make_batch

from kvrelay_kernels import KernelArgumentError, paged_attention, store_kv_cache
from kvrelay_kernels.cpu_kernels.paged_attention import cpu_kernel_usable
from kvrelay_kernels.kv_quant import (
    block_exponents,
    block_values,
    dequantize_blocks,
    dequantize_rows,
    power_of_two,
    quantize_blocks,
    quantize_rows,
)
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton
from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton


def _exponents(packed: torch.Tensor) -> torch.Tensor:
    """Each row's exponent: of packed rows, or of a quantized cache's blocks (4 dims)."""
    if packed.dim() == 4:
        return block_exponents(packed).to(torch.int32)
    return packed.view(torch.int8)[..., -1].to(torch.int32)


def _error_bound(rows: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The largest error quantization may put on each element of ``rows`` (see above):
    ``packed`` is their packed rows, or the quantized cache when ``rows`` is a float one."""
    scale = power_of_two(_exponents(packed))[..., None]
    if packed.dtype == torch.int8:
        return (scale / 2).expand_as(rows)
    return torch.maximum(rows.abs() * 2**-4, scale * 2**-10)


def _quantize(batch: PagedBatch, dtype: torch.dtype) -> PagedBatch:
    """``batch`` with its caches quantized; a NaN (poisoned) row becomes a row that reads
    as inf (int8: 127 * 2**126) or NaN (e4m3's 0x7F), so a stray read still shows."""
    def one(cache: torch.Tensor) -> torch.Tensor:
        packed = quantize_blocks(cache.float().nan_to_num(0.0), dtype)
        poisoned = cache.isnan().any(-1)
        block_values(packed).view(torch.int8)[poisoned] = 127
        block_exponents(packed)[poisoned] = 126
        return packed

    return replace(batch, key_cache=one(batch.key_cache), value_cache=one(batch.value_cache))


def _dequantized(batch: PagedBatch, dtype: torch.dtype) -> PagedBatch:
    return replace(batch, key_cache=dequantize_blocks(batch.key_cache, dtype),
                   value_cache=dequantize_blocks(batch.value_cache, dtype))


# (query_lens, seq_lens): decodes with a partial last block, exactly one block and
# several tiles; a mixed batch with a chunk after a cached prefix and a fresh prompt.
CASES = [
    pytest.param([1, 1, 1, 1], [1, 19, 16, 150], id="decode"),
    pytest.param([1, 19, 37, 1], [70, 64, 37, 33], id="mixed"),
]


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
def test_round_trip_error_is_within_the_step(kv_dtype: torch.dtype) -> None:
    magnitudes = torch.logspace(-6, 4, 200)[:, None, None]
    rows = torch.randn(200, 3, 64) * magnitudes
    rows[7] = 0.0  # an all-zero row quantizes to zeros
    packed = quantize_rows(rows, kv_dtype)
    assert packed.shape == (200, 3, 65)
    assert packed.dtype == kv_dtype
    error = (dequantize_rows(packed, torch.float32) - rows).abs()
    assert (error <= _error_bound(rows, packed)).all()
    assert (dequantize_rows(packed[7], torch.float32) == 0).all()
    if kv_dtype == torch.int8:  # the row's largest value uses at least half the grid
        top = packed[..., :-1].abs().amax(-1).float()
        assert ((top >= 63) | (rows.abs().amax(-1) == 0)).all()


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_store_writes_the_reference_bytes(kv_dtype: torch.dtype, key_dtype: torch.dtype,
                                                 device: str) -> None:
    # Head size 80 (not a power of two), 3 KV heads, a padding slot, scattered slots.
    tokens, kv_heads, head = 10, 3, 80
    scale = torch.logspace(-5, 3, tokens)[:, None, None]
    key = (torch.randn(tokens, kv_heads, head) * scale).to(key_dtype)
    value = (torch.randn(tokens, kv_heads, head) * scale).to(key_dtype)
    key[4] = 0.0
    slots = torch.tensor([0, 5, 9, -1, 17, 18, 19, 20, 31, 2])
    caches = [torch.zeros((4, 8, kv_heads, head + 1), dtype=kv_dtype) for _ in range(2)]
    store_kv_cache_reference(key, value, caches[0], caches[1], slots)
    on_device = [torch.zeros_like(c, device=device) for c in caches]
    store_kv_cache_triton(key.to(device), value.to(device), on_device[0], on_device[1],
                          slots.to(device))
    for ref, got in zip(caches, on_device, strict=True):
        assert torch.equal(ref.view(torch.int8), got.cpu().view(torch.int8))
    untouched = dequantize_blocks(on_device[0].cpu(), torch.float32)[0, 3]
    assert (untouched == 0).all(), "slot 3 is no token's: untouched"
    assert (block_exponents(on_device[0].cpu())[0, 3] == 0).all()


def test_triton_e4m3_rounding_equals_torch_everywhere(device: str) -> None:
    """Every e4m3 value, every midpoint between neighbours (ties go to even) and points
    just off them, each in a row whose 448 pins the scale to 1: the Triton store's
    integer-built e4m3 bits must equal torch's cast."""
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[1:] + codes[:-1]) / 2
    nudge = mids.abs() * 2**-12 + 2**-20
    points = torch.cat([codes, mids, mids + nudge, mids - nudge])
    points = torch.cat([points, -points])
    per_row = 63
    rows = -(-points.numel() // per_row)
    padded = torch.zeros(rows * per_row)
    padded[: points.numel()] = points
    key = torch.cat([torch.full((rows, 1), 448.0), padded.view(rows, per_row)], dim=1)
    key = key.view(rows, 1, 64)
    slots = torch.arange(rows)
    ref = [torch.zeros((rows, 1, 1, 65), dtype=torch.float8_e4m3fn) for _ in range(2)]
    got = [torch.zeros_like(ref[0], device=device) for _ in range(2)]
    store_kv_cache_reference(key, key, ref[0], ref[1], slots)
    store_kv_cache_triton(key.to(device), key.to(device), got[0], got[1], slots.to(device))
    assert (_exponents(ref[0]) == 0).all()
    assert torch.equal(ref[0].view(torch.int8), got[0].cpu().view(torch.int8))


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
@pytest.mark.parametrize(("query_lens", "seq_lens"), CASES)
def test_reference_reads_the_dequantized_values(kv_dtype, query_lens, seq_lens) -> None:
    clean, _ = make_batch(query_lens, seq_lens, num_heads=6, num_kv_heads=2, head_size=64,
                          block_size=16, dtype=torch.float32, device="cpu")
    quantized = _quantize(clean, kv_dtype)
    got = paged_attention_reference(*quantized.args(), 0.125)
    expected = paged_attention_reference(*_dequantized(quantized, torch.float32).args(), 0.125)
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
@pytest.mark.parametrize(("query_lens", "seq_lens"), CASES)
def test_quantization_error_is_within_the_derived_bound(kv_dtype, query_lens,
                                                        seq_lens) -> None:
    clean, _ = make_batch(query_lens, seq_lens, num_heads=6, num_kv_heads=2, head_size=64,
                          block_size=16, dtype=torch.float32, device="cpu")
    quantized = _quantize(clean, kv_dtype)
    scale = 0.125
    exact = paged_attention_reference(*clean.args(), scale)
    got = paged_attention_reference(*quantized.args(), scale)
    dk = _error_bound(clean.key_cache, quantized.key_cache).amax()
    dv = _error_bound(clean.value_cache, quantized.value_cache).amax()
    # Per query row: E = scale * |q|_1 * max|dk|, bound (exp(2E) - 1) max|v| + max|dv|.
    energy = scale * clean.query.abs().sum(-1, keepdim=True) * dk
    bound = (torch.exp(2 * energy) - 1) * clean.value_cache.abs().amax() + dv
    assert ((got - exact).abs() <= bound).all()
    assert (got - exact).abs().amax() > 0  # the cache really was quantized


@pytest.mark.parametrize("kv_dtype", QUANT_DTYPES)
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("query_lens", "seq_lens"), CASES)
def test_triton_matches_the_reference(kv_dtype, query_dtype, query_lens, seq_lens,
                                      device) -> None:
    # SmolLM2's group of 3 query heads per KV head, block size 16; stray reads give NaN.
    clean, poisoned = make_batch(query_lens, seq_lens, num_heads=9, num_kv_heads=3,
                                 head_size=64, block_size=16, dtype=torch.float32,
                                 device="cpu")
    clean, poisoned = _quantize(clean, kv_dtype), _quantize(poisoned, kv_dtype)

    def on(batch: PagedBatch) -> PagedBatch:
        return replace(batch, query=batch.query.to(device, query_dtype),
                       key_cache=batch.key_cache.to(device),
                       value_cache=batch.value_cache.to(device),
                       block_tables=batch.block_tables.to(device),
                       query_start_loc=batch.query_start_loc.to(device),
                       seq_lens=batch.seq_lens.to(device))

    expected = paged_attention_reference(*on(clean).args(), 0.125)
    got = paged_attention_triton(*on(poisoned).args(), 0.125)
    assert torch.isfinite(got).all(), "a stray read"
    atol, rtol = TOLERANCES[query_dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


def test_public_doors_check_the_quantized_row_size() -> None:
    key = torch.randn(2, 1, 64)
    slots = torch.tensor([0, 1])
    wrong = torch.zeros((1, 16, 1, 64), dtype=torch.int8)  # no room for the scale byte
    with pytest.raises(KernelArgumentError, match="key_cache"):
        store_kv_cache(key, key, wrong, wrong.clone(), slots)
    query = torch.randn(1, 2, 64)
    tables = torch.zeros((1, 1), dtype=torch.int32)
    starts, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    with pytest.raises(KernelArgumentError, match="key_cache"):
        paged_attention(query, wrong, wrong.clone(), tables, starts, lens, 0.125)
    good = torch.zeros((1, 16, 1, 65), dtype=torch.int8)
    store_kv_cache(key, key, good, good.clone(), slots)
    out = paged_attention(query, good, good.clone(), tables, starts, lens, 0.125)
    assert out.shape == query.shape
    assert torch.isfinite(out).all()


def test_the_cpu_kernel_declines_a_quantized_cache() -> None:
    """The compiled CPU kernel reads float caches only; the reference serves quantized ones."""
    query = torch.randn(1, 2, 64)
    assert not cpu_kernel_usable(query, torch.zeros((1, 16, 1, 65), dtype=torch.int8))
    assert not cpu_kernel_usable(query, torch.zeros((1, 16, 1, 65),
                                                    dtype=torch.float8_e4m3fn))


def test_the_power_of_two_scale_is_exact() -> None:
    exponents = torch.arange(-126, 127)
    assert torch.equal(power_of_two(exponents), torch.tensor(
        [math.ldexp(1.0, int(e)) for e in exponents], dtype=torch.float32))
