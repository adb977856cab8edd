"""Weight-only quantized matmul (CPU dequantized tiles and reference) against dequantize+linear.

The integer dot-product and GEMM kernels, which also round the activations, have their own
tests (``test_cpu_quantized_linear.py``, ``test_cpu_int16_gemm.py``); here they are turned
off so that every product takes the weight-only paths.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvrelay_kernels import KernelArgumentError, cpu_quantized_matmul
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


@pytest.fixture(autouse=True)
def weight_only_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_quantized_matmul, "INTEGER_DOT_MAX_ROWS", {8: 0, 4: 0})
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")


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
    ("bits", "shape", "group_size", "rows", "bias", "tiles"),
    [
        (8, (40, 96), None, 1, True, True),
        (8, (40, 96), 32, 3, False, True),
        (4, (40, 128), 32, 1, True, True),
        (4, (40, 96), 32, 7, False, False),  # groups straddle the row halves: the reference
        (8, (3000, 64), 32, 6, True, True),  # tiles of 1024 output channels, one partial
        (4, (40, 128), 64, 2, True, True),
        (4, (70, 256), 32, 1, False, True),  # float16 scales and minimums
    ],
)
def test_cpu_matmul_matches_reference(bits: int, shape: tuple[int, int],
                                      group_size: int | None, rows: int, bias: bool,
                                      tiles: bool) -> None:
    w = torch.randn(*shape)
    qw = quantize_int8(w, group_size) if bits == 8 else quantize_int4(w, group_size or 32)
    x = torch.randn(rows, shape[1])
    b = torch.randn(shape[0]) if bias else None
    got = quantized_matmul(x, qw, b)
    expected = F.linear(x, dequantize_weight(qw), b)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert cpu_quantized_matmul.dequantized_tiles_serve(qw) == tiles
    if tiles and cpu_quantized_matmul.load_cpu_kernels():
        direct = torch.ops.kvrelay_cpu.dequantized_linear(
            x, qw.qweight, qw.scales, qw.mins, qw.bits, qw.group_size, b)
        assert torch.equal(got, direct)


def test_leading_dims_and_dtype_are_kept() -> None:
    qw = quantize_int8(torch.randn(16, 32))
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    out = quantized_matmul_reference(x, qw)
    got = quantized_matmul(x, qw)
    assert got.shape == (2, 3, 16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, out)


def test_reference_switch_gives_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    qw = quantize_int4(torch.randn(40, 128), 32)
    x = torch.randn(3, 128)
    compiled = quantized_matmul(x, qw)
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    torch.testing.assert_close(quantized_matmul(x, qw), compiled, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not cpu_quantized_matmul.load_cpu_kernels(), reason="no C++ compiler here")
def test_tiles_kernel_refuses_layouts_it_cannot_read() -> None:
    op = torch.ops.kvrelay_cpu.dequantized_linear
    qw = quantize_int4(torch.randn(8, 96), 32)
    with pytest.raises(RuntimeError, match="K/2 a multiple of group_size"):
        op(torch.randn(2, 96), qw.qweight, qw.scales, qw.mins, 4, 32, None)
    qw = quantize_int4(torch.randn(8, 128), 32)
    with pytest.raises(RuntimeError, match="mins"):
        op(torch.randn(2, 128), qw.qweight, qw.scales, None, 4, 32, None)
    with pytest.raises(RuntimeError, match="K"):
        op(torch.randn(2, 64), qw.qweight, qw.scales, qw.mins, 4, 32, None)


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
    int8 = quantize_int8(torch.randn(8, 64), 32)
    with pytest.raises(KernelArgumentError, match="mins"):  # int8 mins: typed like scales
        quantized_matmul(torch.randn(1, 64), QuantizedWeight(
            int8.qweight, int8.scales, int8.scales.half(), 8, 32, 64))


def test_int8_with_minimums_dequantizes_asymmetrically() -> None:
    """int8 may carry a minimum per group (GGUF's Q5_1, Q5_K): ``w = q * scale + min``."""
    qw = quantize_int8(torch.randn(6, 64), 16)
    mins = torch.randn(6, 4)
    asymmetric = QuantizedWeight(qw.qweight, qw.scales, mins, 8, 16, 64)
    asymmetric.check()
    expected = dequantize_weight(qw) + mins.repeat_interleave(16, dim=1)
    assert torch.equal(dequantize_weight(asymmetric), expected)


@pytest.mark.skipif(not cpu_quantized_matmul.load_cpu_kernels(), reason="no C++ compiler here")
@pytest.mark.parametrize("rows", [5, 80])  # tiles of channels; the whole matrix at once
def test_tiles_kernel_runs_under_inference_mode_on_every_thread(rows: int) -> None:
    """The engine runs under ``torch.inference_mode``, which pool threads do not inherit:
    tiles handled by the second thread must not write the output through a tensor op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            qw = quantize_int4(torch.randn(4096, 128), 32)  # 8 tiles of 512 channels
            x = torch.randn(rows, 128)
            got = torch.ops.kvrelay_cpu.dequantized_linear(x, qw.qweight, qw.scales, qw.mins,
                                                           4, 32, None)
            expected = F.linear(x, dequantize_weight(qw))
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
