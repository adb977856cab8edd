"""The C++ FP8-weight kernel against the PyTorch reference, on every ISA path this CPU runs.

``fp8_isas()`` lists the paths the build's run-time dispatch finds on this CPU (AVX-512,
AVX2, scalar); each is forced in turn. Odd shapes: 1 to 9 rows (dot products up to 8,
dequantized tiles from 9), K that is no multiple of 8, 16 or 64 (SIMD tails), odd N,
scales per channel and per 128-input group with a partial last group.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.cpu_fp8_matmul import fp8_isas, fp8_matmul_cpu
from kvrelay_kernels.fp8_matmul import fp8_matmul
from kvrelay_kernels.fp8_weight import FP8_DTYPE, Fp8Weight
from kvrelay_kernels.reference.fp8_matmul import dequantize_fp8, fp8_matmul_reference

ISAS = fp8_isas()
pytestmark = pytest.mark.skipif(not ISAS, reason="no C++ compiler here")

# Every finite float8_e4m3fn encoding (0x7F and 0xFF are the NaNs).
FINITE = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)


def fp8_weight(n: int, k: int, group: int | None = None) -> Fp8Weight:
    """A random FP8 matrix over the whole e4m3 range (subnormals included), and scales."""
    g = k if group is None else group
    values = torch.randn(n, k) * torch.exp2(torch.randint(-9, 8, (n, k)).float())
    weight = values.clamp(-448, 448).to(FP8_DTYPE)
    scales = torch.rand(n, -(-k // g)) * 0.01 + 1e-4
    return Fp8Weight(weight, scales, g)


def test_every_isa_of_this_cpu_is_listed_and_scalar_last() -> None:
    assert ISAS[-1] == "scalar"
    assert set(ISAS) <= {"avx512", "avx2", "scalar"}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize(("n", "k", "group"), [(33, 577, None), (7, 300, 128), (65, 45, None),
                                               (17, 1000, 128), (5, 8, None)])
def test_matches_the_reference(isa: str, rows: int, n: int, k: int, group: int | None) -> None:
    torch.manual_seed(rows * 1000 + k)
    weight = fp8_weight(n, k, group)
    weight.check()
    x = torch.randn(rows, k)
    bias = torch.randn(n) if rows % 2 else None
    got = fp8_matmul_cpu(x, weight, bias, isa)
    assert got is not None
    torch.testing.assert_close(got, fp8_matmul_reference(x, weight, bias), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 70])  # the dot products, and the whole-matrix GEMM
def test_every_finite_encoding_converts_exactly(isa: str, rows: int) -> None:
    """Row ``b`` holds encoding ``b`` at input 9 (inside a SIMD block) and at input 21 (in
    the tail of a K of 22), so the product with one-hot inputs is the value itself."""
    n, k = FINITE.numel(), 22
    stored = torch.zeros(n, k, dtype=torch.uint8)
    for column in (9, 21):
        stored[:, column] = FINITE
        weight = Fp8Weight(stored.view(FP8_DTYPE), torch.ones(n, 1), k)
        x = torch.zeros(rows, k)
        x[:, column] = 1.0
        got = fp8_matmul_cpu(x, weight, None, isa)
        expected = FINITE.view(FP8_DTYPE).float().expand(rows, n)
        assert got is not None
        assert torch.equal(got, expected), (isa, column)
        stored[:, column] = 0


@pytest.mark.parametrize("isa", ISAS)
def test_many_output_channels_split_over_threads(isa: str) -> None:
    weight = fp8_weight(3001, 576)
    x = torch.randn(3, 576)
    torch.testing.assert_close(fp8_matmul_cpu(x, weight, None, isa),
                               x @ dequantize_fp8(weight).T, rtol=1e-5, atol=1e-5)


def test_the_door_takes_the_kernel_and_keeps_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = fp8_weight(24, 100, 128)
    x = torch.randn(2, 3, 100, dtype=torch.bfloat16)
    got = fp8_matmul(x, weight)
    assert got.shape == (2, 3, 24)
    assert got.dtype == torch.bfloat16
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    torch.testing.assert_close(got, fp8_matmul(x, weight), rtol=1e-2, atol=1e-2)


def test_an_isa_this_cpu_lacks_is_refused() -> None:
    missing = [isa for isa in ("avx512", "avx2") if isa not in ISAS]
    if not missing:
        pytest.skip("this CPU runs every path")
    weight = fp8_weight(4, 16)
    with pytest.raises(RuntimeError, match="not available on this CPU"):
        fp8_matmul_cpu(torch.randn(1, 16), weight, None, missing[0])
