"""The Triton W8A16/W4A16 GEMM against dequantize+linear (interpreted on a CPU machine).

Tiny odd shapes: partial M/N/K tiles, a K tile that straddles the int4 row halves, group
sizes 32/64 and per channel, with and without bias, float32 and bfloat16 activations.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.quantized_matmul import quantized_matmul
from kvrelay_kernels.quantized_weight import quantize_int4, quantize_int8
from kvrelay_kernels.reference.quantized_matmul import quantized_matmul_reference


@pytest.fixture(autouse=True)
def _triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")


@pytest.mark.parametrize(
    ("bits", "n", "k", "group_size", "m", "bias"),
    [
        (8, 40, 96, None, 1, True),    # per channel; K = one full and one partial tile
        (8, 17, 64, 32, 5, False),
        (4, 40, 160, 32, 3, True),     # K/2 = 80: a tile straddles the two nibble halves
        (4, 70, 128, 64, 1, False),    # N over one tile
        (4, 9, 96, 32, 18, True),      # M over one 16-row tile
    ],
)
def test_triton_matches_reference(device: str, bits: int, n: int, k: int,
                                  group_size: int | None, m: int, bias: bool) -> None:
    w = torch.randn(n, k)
    qw = quantize_int8(w, group_size) if bits == 8 else quantize_int4(w, group_size or 32)
    qw = qw.to(torch.device(device))
    x = torch.randn(m, k, device=device)
    b = torch.randn(n, device=device) if bias else None
    torch.testing.assert_close(quantized_matmul(x, qw, b),
                               quantized_matmul_reference(x, qw, b), rtol=1e-4, atol=1e-4)


def test_triton_bfloat16_activations(device: str) -> None:
    qw = quantize_int4(torch.randn(24, 64), 32).to(torch.device(device))
    x = torch.randn(2, 64, device=device, dtype=torch.bfloat16)
    got = quantized_matmul(x, qw)
    assert got.dtype == torch.bfloat16
    # the kernel rounds the dequantized weight to bfloat16 before the product
    torch.testing.assert_close(got.float(), quantized_matmul_reference(x, qw).float(),
                               rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize(
    ("bits", "n", "k", "group_size", "m", "bias"),
    [
        (8, 40, 448, None, 1, True),   # per channel, 7 column tiles over 3 splits
        (8, 33, 512, 64, 4, False),
        (4, 70, 512, 32, 1, True),     # both nibble halves of each byte tile, per split
        (4, 24, 480, 32, 2, False),    # K/2 = 240 is no multiple of 32: per-element scales
        (4, 64, 1024, 128, 16, True),
    ],
)
def test_split_k_matches_reference(device: str, bits: int, n: int, k: int,
                                   group_size: int | None, m: int, bias: bool) -> None:
    from kvrelay_kernels.triton_kernels.quantized_matmul import quantized_matmul_triton

    w = torch.randn(n, k)
    qw = quantize_int8(w, group_size) if bits == 8 else quantize_int4(w, group_size or 32)
    qw = qw.to(torch.device(device))
    x = torch.randn(m, k, device=device)
    b = torch.randn(n, device=device) if bias else None
    torch.testing.assert_close(quantized_matmul_triton(x, qw, b, num_splits=3),
                               quantized_matmul_reference(x, qw, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("group_size", "mins", "dtype", "m", "num_splits"), [
    (16, False, torch.float32, 1, None),   # GGUF's Q6_K: groups of 16, per-element scales
    (16, False, torch.float32, 5, 3),
    (32, True, torch.float16, 3, None),    # Q5_1: int8 with float16 minimums
    (32, True, torch.float32, 1, 3),       # Q5_K: float32 scales and minimums
    (64, True, torch.float32, 18, None),
])
def test_int8_groups_of_16_and_minimums(device: str, group_size: int, mins: bool,
                                        dtype: torch.dtype, m: int,
                                        num_splits: int | None) -> None:
    from kvrelay_kernels.quantized_weight import QuantizedWeight
    from kvrelay_kernels.triton_kernels.quantized_matmul import quantized_matmul_triton

    n, k = 40, 512
    qw = quantize_int8(torch.randn(n, k), group_size)
    minimums = (torch.randn(n, k // group_size) * 0.1).to(dtype) if mins else None
    qw = QuantizedWeight(qw.qweight, qw.scales.to(dtype), minimums, 8, group_size, k)
    qw = qw.to(torch.device(device))
    x = torch.randn(m, k, device=device)
    b = torch.randn(n, device=device)
    torch.testing.assert_close(quantized_matmul_triton(x, qw, b, num_splits=num_splits),
                               quantized_matmul_reference(x, qw, b), rtol=1e-4, atol=1e-4)


def test_decode_shapes_are_split_to_fill_the_device() -> None:
    """At batch 1 a 4096-row layer is 64 output tiles: split along K to fill 132 SMs."""
    from kvrelay_kernels.triton_kernels.quantized_matmul import (
        BLOCK_N,
        plan_quantized_matmul,
    )

    for bits, group in ((8, 4096), (4, 32), (4, 128)):
        plan = plan_quantized_matmul(1, 4096, 4096, bits, group, 132)
        assert plan.num_splits > 1
        assert (4096 // BLOCK_N) * plan.num_splits >= 132
        assert plan.tile_in_group, "real layers take the vector-scale path"
    big_batch = plan_quantized_matmul(256, 4096, 4096, 4, 32, 132)
    assert big_batch.num_splits == 1


def test_a_shape_is_planned_once() -> None:
    from kvrelay_kernels.triton_kernels.quantized_matmul import plan_quantized_matmul

    plan_quantized_matmul.cache_clear()
    for _ in range(5):
        plan_quantized_matmul(1, 4096, 14336, 4, 64, 132)
    info = plan_quantized_matmul.cache_info()
    assert (info.misses, info.hits) == (1, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (2.2 GB of weight)")
def test_rows_past_two_to_the_31_elements_are_read_where_they_are() -> None:
    """``n * K`` past 2**31: 32-bit offsets would wrap and read another row's bytes."""
    k = 4096
    n = 2**31 // k + 2 * 64
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    scales = torch.rand(n, 1, device="cuda") * 0.01 + 0.001
    from kvrelay_kernels.quantized_weight import QuantizedWeight

    qw = QuantizedWeight(q, scales, None, 8, k, k)
    x = torch.randn(1, k, device="cuda")
    got = quantized_matmul(x, qw)
    tail = slice(n - 128, n)
    want = x @ (q[tail].float() * scales[tail]).T
    torch.testing.assert_close(got[:, tail], want, rtol=1e-4, atol=1e-3)
