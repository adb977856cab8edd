"""The integer dot-product CPU kernel against the arithmetic it promises, done in PyTorch.

The kernel quantizes each row of activations to int16 in blocks of 32 (scale amax / 32767,
round to nearest) and multiplies with the packed weights in integers; for int4 the
minimums multiply the exact float sum of each block. ``emulate`` computes the same thing
with float64 tensors, so the only difference allowed is float32 rounding.
"""

from __future__ import annotations

import pytest
import torch
from quantized_cases import KINDS, emulate, weights, with_mins

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight

pytestmark = pytest.mark.skipif(not load_cpu_kernels(), reason="no C++ compiler here")


def run(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.kvrelay_cpu.quantized_linear(x, weight.qweight, weight.scales, weight.mins,
                                                  weight.bits, weight.group_size, bias)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_matches_the_integer_arithmetic(kind: str, rows: int) -> None:
    torch.manual_seed(rows)
    qw = weights(kind, 70, 256)
    x = torch.randn(rows, 256)
    bias = torch.randn(70) if rows % 2 else None
    torch.testing.assert_close(run(x, qw, bias), emulate(x, qw, bias), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("kind", [k for k in KINDS if "-g32" in k])
@pytest.mark.parametrize("k", [576, 1536])  # 18 blocks (a tail after 8-block runs), 48
def test_one_row_with_groups_of_32(kind: str, k: int) -> None:
    """Batch-1 decode's own loop (scales and minimum terms eight blocks at a time)."""
    torch.manual_seed(k)
    qw = weights(kind, 37, k)
    x = torch.randn(1, k)
    bias = torch.randn(37)
    torch.testing.assert_close(run(x, qw, bias), emulate(x, qw, bias), rtol=1e-5, atol=2e-5)


def test_many_output_channels_split_over_threads() -> None:
    qw = weights("int4-g32", 3000, 576)
    x = torch.randn(3, 576)
    torch.testing.assert_close(run(x, qw, None), emulate(x, qw, None), rtol=1e-5, atol=2e-5)


def test_zero_and_extreme_activations() -> None:
    qw = weights("int8-g32", 16, 128)
    x = torch.zeros(2, 128)
    x[1, :32] = 1e30  # one huge block: its scale is large, the others stay zero
    x[1, 64] = -3.0
    torch.testing.assert_close(run(x, qw, None), emulate(x, qw, None), rtol=1e-5, atol=1e-5)
    assert torch.equal(run(x[:1], qw, None), torch.zeros(1, 16))


def test_quantization_error_stays_near_the_weight_only_product() -> None:
    """What activation quantization costs against dequantize + float matmul: about float
    rounding (int16 steps are 1/32767 of a block's largest value), even for blocks with
    one large value, as in real models' activations."""
    torch.manual_seed(0)
    qw = weights("int4-g32", 512, 576)
    x = torch.randn(4, 576)
    x[:, ::32] *= 50  # one outlier in every block
    exact = x.double() @ dequantize_weight(qw).double().T
    error = (run(x, qw, None).double() - exact).abs().max() / exact.abs().max()
    assert 0 < error < 1e-4


@pytest.mark.parametrize(("qw", "x", "message"), [
    (quantize_int8(torch.randn(8, 64)), torch.randn(2, 128)[:, ::2], "contiguous"),
    (quantize_int8(torch.randn(8, 96), 48), torch.randn(1, 96), "multiple of 32"),
    (with_mins(quantize_int8(torch.randn(8, 64), 32), torch.float16), torch.randn(1, 64),
     "mins must be shaped and typed like scales"),
    (with_mins(quantize_int8(torch.randn(8, 64), 16), torch.float32), torch.randn(1, 64),
     "16, for int8 without mins"),
    (quantize_int4(torch.randn(8, 96), 32), torch.randn(1, 96), "K/2 a multiple of 32"),
    (quantize_int8(torch.randn(8, 64)), torch.randn(1, 64).double(), "float32"),
    (quantize_int8(torch.randn(8, 64)), torch.randn(1, 32), "K"),
])
def test_bad_arguments_are_refused(qw: QuantizedWeight, x: torch.Tensor, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        run(x, qw, None)


def test_quantized_matmul_takes_the_kernel_for_few_rows_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to ``INTEGER_DOT_MAX_ROWS`` rows the public entry point gives the kernel's very
    numbers; above it, with the integer GEMM off, those of the weight-only path (no
    activation rounding)."""
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")
    qw = weights("int4-g32", 64, 128)
    limit = cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS[4]
    few, many = torch.randn(limit, 128), torch.randn(limit + 1, 128)
    assert torch.equal(quantized_matmul(few, qw), run(few, qw, None))
    weight_only = quantized_matmul(many, qw)
    torch.testing.assert_close(weight_only, many @ dequantize_weight(qw).T, rtol=1e-5,
                               atol=1e-4)
    assert not torch.equal(weight_only, run(many, qw, None))


def test_shapes_the_kernel_cannot_serve_keep_the_weight_only_path() -> None:
    qw = quantize_int4(torch.randn(16, 96), 32)  # K/2 = 48: not whole blocks
    x = torch.randn(1, 96)
    torch.testing.assert_close(quantized_matmul(x, qw), x @ dequantize_weight(qw).T,
                               rtol=1e-5, atol=1e-4)


def test_reference_switch_turns_the_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    qw = weights("int8-g32", 32, 128)
    x = torch.randn(2, 128)
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    assert torch.equal(quantized_matmul(x, qw), x @ dequantize_weight(qw).T)
