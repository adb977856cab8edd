"""Weight-only quantized matmul (CPU compiled loop and reference) against dequantize+linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvrelay_kernels import KernelArgumentError
from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import (
    QuantizedWeight,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from kvrelay_kernels.reference.quantized_matmul import (
    dequantize_weight,
    quantized_matmul_reference,
)


def test_int4_packing_round_trips() -> None:
    values = torch.randint(0, 16, (5, 12), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(values)), values)


@pytest.mark.parametrize("group_size", [None, 16])
def test_int8_error_is_within_half_a_step(group_size: int | None) -> None:
    w = torch.randn(24, 64)
    qw = quantize_int8(w, group_size)
    step = qw.scales.float().repeat_interleave(qw.group_size, dim=1)
    assert ((dequantize_weight(qw) - w).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_is_within_half_a_step(group_size: int) -> None:
    w = torch.randn(8, 256)
    qw = quantize_int4(w, group_size)
    step = qw.scales.float().repeat_interleave(group_size, dim=1)
    # float16 rounding of the minimum can add a little to the half step
    slack = qw.mins.float().abs().repeat_interleave(group_size, dim=1) * 2**-10  # type: ignore[union-attr]
    assert ((dequantize_weight(qw) - w).abs() <= step / 2 + slack + 1e-6).all()


@pytest.mark.parametrize(
    ("bits", "shape", "group_size", "rows", "bias"),
    [
        (8, (40, 96), None, 1, True),
        (8, (40, 96), 32, 3, False),
        (4, (40, 96), 32, 1, True),
        (4, (40, 96), 32, 7, False),   # above the fused loop's row limit: dequantize + GEMM
        (8, (300, 64), 32, 6, True),   # ... in tiles of 256 output channels (one partial)
        (4, (40, 128), 64, 2, True),
    ],
)
def test_cpu_matmul_matches_reference(bits: int, shape: tuple[int, int],
                                      group_size: int | None, rows: int, bias: bool) -> None:
    w = torch.randn(*shape)
    qw = quantize_int8(w, group_size) if bits == 8 else quantize_int4(w, group_size or 32)
    x = torch.randn(rows, shape[1])
    b = torch.randn(shape[0]) if bias else None
    got = quantized_matmul(x, qw, b)
    expected = F.linear(x, dequantize_weight(qw), b)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_leading_dims_and_dtype_are_kept() -> None:
    qw = quantize_int8(torch.randn(16, 32))
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    out = quantized_matmul_reference(x, qw)
    got = quantized_matmul(x, qw)
    assert got.shape == (2, 3, 16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, out)


def test_reference_switch_gives_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    qw = quantize_int4(torch.randn(40, 96), 32)
    x = torch.randn(1, 96)
    compiled = quantized_matmul(x, qw)
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    torch.testing.assert_close(quantized_matmul(x, qw), compiled, rtol=1e-5, atol=1e-4)


def test_bad_input_raises_typed_errors() -> None:
    qw = quantize_int4(torch.randn(8, 64), 32)
    with pytest.raises(KernelArgumentError, match="in_features"):
        quantized_matmul(torch.randn(1, 63), qw)
    with pytest.raises(KernelArgumentError, match="bias"):
        quantized_matmul(torch.randn(1, 64), qw, torch.randn(7))
    broken = QuantizedWeight(qw.qweight, qw.scales, None, 4, 32, 64)
    with pytest.raises(KernelArgumentError, match="mins"):
        quantized_matmul(torch.randn(1, 64), broken)
    with pytest.raises(KernelArgumentError, match="group_size"):
        quantize_int4(torch.randn(8, 96), 64)
