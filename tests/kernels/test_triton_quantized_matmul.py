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
