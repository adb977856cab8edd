"""The integer GEMM CPU kernel (``cpu_kernels/int16_gemm.cpp``) against the arithmetic it
promises (``quantized_cases.emulate``: int16 activation blocks, products in float64), its
packing, its threads, its argument checks, and the rows ``quantized_matmul`` gives it.
"""

from __future__ import annotations

import gc

import pytest
import torch
from quantized_cases import KINDS, emulate, weights

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight

pytestmark = pytest.mark.skipif(
    not load_cpu_kernels() or torch.ops.kvrelay_cpu.int16_gemm_lanes() == 0,
    reason="no C++ compiler here, or no integer GEMM at this instruction-set level")

GEMM_KINDS = [k for k in KINDS if k != "int8-g16"]  # Q6_K's groups of 16 stay on the tiles


def pack(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.ops.kvrelay_cpu.pack_int16_gemm(qw.qweight, qw.scales, qw.mins, qw.bits,
                                                 qw.group_size, qw.in_features)


def run(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    values, scales, mins = pack(qw)
    return torch.ops.kvrelay_cpu.int16_gemm(x, values, scales, mins, qw.out_features, bias)


@pytest.mark.parametrize("kind", GEMM_KINDS)
@pytest.mark.parametrize("rows", [1, 3, 4, 13, 64, 67])
def test_matches_the_integer_arithmetic(kind: str, rows: int) -> None:
    """Rows and channels that fill no whole tile (70 channels: 4 or 8 lane groups and a
    remainder; 67 rows: two row panels, the second one a partial row tile)."""
    torch.manual_seed(rows)
    qw = weights(kind, 70, 256)
    x = torch.randn(rows, 256)
    bias = torch.randn(70) if rows % 2 else None
    torch.testing.assert_close(run(x, qw, bias), emulate(x, qw, bias), rtol=1e-5, atol=2e-5)


def test_smollm2_shapes_and_a_wide_input() -> None:
    torch.manual_seed(0)
    for n, k in ((960, 576), (576, 1536)):
        qw = weights("int4-g32", n, k)
        x = torch.randn(40, k)
        torch.testing.assert_close(run(x, qw, None), emulate(x, qw, None), rtol=1e-5,
                                   atol=5e-5)


def test_threads_do_not_change_a_bit() -> None:
    """Each thread computes whole channel groups of a panel of rows: any split, the same
    sums in the same order."""
    torch.manual_seed(1)
    qw = weights("int4-g32", 200, 512)
    x = torch.randn(150, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x, qw, None)
        torch.set_num_threads(2)
        two = run(x, qw, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_zero_and_extreme_activations() -> None:
    torch.manual_seed(2)
    qw = weights("int8-g32-mins-fp16", 48, 128)
    x = torch.randn(20, 128)
    x[0] = 0.0
    x[1, :32] = 0.0
    x[2] *= 1e4
    x[3, 5] = -3e4
    torch.testing.assert_close(run(x, qw, None), emulate(x, qw, None), rtol=1e-5, atol=1e-3)


def test_packing_lays_each_channel_pair_in_its_lane() -> None:
    """Lane c of channel group g holds inputs 2p and 2p + 1 of channel g * lanes + c."""
    lanes = torch.ops.kvrelay_cpu.int16_gemm_lanes()
    qw = quantize_int8(torch.randn(lanes + 3, 64), 32)
    values, scales, mins = pack(qw)
    assert values.shape == (2, 64 * lanes)
    assert scales.shape == (2, 2 * lanes)
    assert mins.numel() == 0
    laid = values.reshape(2, 32, lanes, 2)  # [group, pair, lane, 2]
    channels = laid.permute(0, 2, 1, 3).reshape(2 * lanes, 64)
    assert torch.equal(channels[:lanes + 3], qw.qweight)
    assert not channels[lanes + 3:].any()  # channels past N are zero
    assert torch.equal(scales.reshape(2, 2, lanes).permute(0, 2, 1).reshape(2 * lanes, 2)
                       [:lanes + 3], qw.scales)


def test_int4_nibbles_unpack_to_both_halves_of_the_row() -> None:
    qw = quantize_int4(torch.randn(5, 128), 32)
    values, _, mins = pack(qw)
    lanes = torch.ops.kvrelay_cpu.int16_gemm_lanes()
    channels = values.reshape(1, 64, lanes, 2).permute(0, 2, 1, 3).reshape(lanes, 128)
    low, high = qw.qweight & 15, qw.qweight >> 4
    assert torch.equal(channels[:5], torch.cat((low, high), 1).to(torch.int8))
    assert mins.shape == (1, 4 * lanes)


@pytest.mark.parametrize(("qw", "message"), [
    (quantize_int8(torch.randn(8, 64), 16), "whole 32-input blocks"),
    (quantize_int4(torch.randn(8, 96), 32), "whole 32-input blocks"),
])
def test_layouts_it_cannot_take_are_refused_at_packing(qw: QuantizedWeight, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        pack(qw)


def test_bad_arguments_are_refused() -> None:
    qw = quantize_int8(torch.randn(40, 64), 32)
    values, scales, mins = pack(qw)
    gemm = torch.ops.kvrelay_cpu.int16_gemm
    with pytest.raises(RuntimeError, match="values"):
        gemm(torch.randn(2, 96), values, scales, mins, 40, None)  # K does not match
    with pytest.raises(RuntimeError, match="values"):
        gemm(torch.randn(2, 64), values, scales, mins, 80, None)  # N does not match
    with pytest.raises(RuntimeError, match="float32"):
        gemm(torch.randn(2, 64).double(), values, scales, mins, 40, None)
    with pytest.raises(RuntimeError, match="contiguous"):
        gemm(torch.randn(2, 128)[:, ::2], values, scales, mins, 40, None)
    with pytest.raises(RuntimeError, match="bias"):
        gemm(torch.randn(2, 64), values, scales, mins, 40, torch.randn(39))
    with pytest.raises(RuntimeError, match="block_scales"):
        gemm(torch.randn(2, 64), values, scales[:, :-1].contiguous(), mins, 40, None)
    with pytest.raises(RuntimeError, match="block_mins"):
        gemm(torch.randn(2, 64), values, scales, torch.zeros(3), 40, None)


def test_quantized_matmul_gives_it_the_rows_above_the_dot_product(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``INTEGER_DOT_MAX_ROWS`` the public entry point returns the GEMM's very numbers;
    ``KVRELAY_CPU_INT16_GEMM=0`` sends them to the weight-only tiles instead; Q6_K's groups
    of 16 always go there."""
    torch.manual_seed(3)
    qw = weights("int4-g32", 64, 128)
    many = torch.randn(cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS[4] + 1, 128)
    bias = torch.randn(64)
    assert torch.equal(quantized_matmul(many, qw, bias), run(many, qw, bias))
    monkeypatch.setenv("KVRELAY_CPU_INT16_GEMM", "0")
    torch.testing.assert_close(quantized_matmul(many, qw, bias),
                               many @ dequantize_weight(qw).T + bias, rtol=1e-5, atol=1e-4)
    monkeypatch.delenv("KVRELAY_CPU_INT16_GEMM")
    q6k = weights("int8-g16", 64, 128)
    torch.testing.assert_close(quantized_matmul(many, q6k), many @ dequantize_weight(q6k).T,
                               rtol=1e-5, atol=1e-4)


def test_a_weight_is_packed_once_and_its_copy_dropped_with_it() -> None:
    """Kept per qweight; new scales on the same values are packed again, not served stale."""
    qw = weights("int8-g32", 64, 128)
    first = cpu_quantized_matmul.int16_gemm_pack(qw)
    assert cpu_quantized_matmul.int16_gemm_pack(qw) is first
    rescaled = QuantizedWeight(qw.qweight, qw.scales * 2, None, 8, 32, 128)  # same values
    again = cpu_quantized_matmul.int16_gemm_pack(rescaled)
    assert again is not first
    assert torch.equal(again[1], first[1] * 2)
    key = id(qw.qweight)
    assert key in cpu_quantized_matmul._GEMM_PACKS
    del qw, rescaled
    gc.collect()
    assert key not in cpu_quantized_matmul._GEMM_PACKS
