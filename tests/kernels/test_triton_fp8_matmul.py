"""The Triton FP8-weight GEMM against the reference (interpreted on a CPU machine).

The kernel loads the FP8 bytes as uint8 and converts them itself, so it runs where the
GPU (or the interpreter) has no FP8 type: every finite encoding must come out exact.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.fp8_matmul import fp8_matmul
from kvrelay_kernels.fp8_weight import FP8_DTYPE, Fp8Weight
from kvrelay_kernels.reference.fp8_matmul import fp8_matmul_reference


@pytest.fixture(autouse=True)
def _triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")


def fp8_weight(n: int, k: int, group: int | None, device: str) -> Fp8Weight:
    g = k if group is None else group
    values = torch.randn(n, k) * torch.exp2(torch.randint(-9, 8, (n, k)).float())
    return Fp8Weight(values.clamp(-448, 448).to(FP8_DTYPE).to(device),
                     (torch.rand(n, -(-k // g)) * 0.01 + 1e-4).to(device), g)


@pytest.mark.parametrize(
    ("m", "n", "k", "group", "bias"),
    [
        (1, 33, 77, None, True),    # per channel: partial K and N tiles
        (3, 70, 300, 128, False),   # 128-input groups, the last one partial (44)
        (18, 9, 45, 16, True),      # M over one 16-row tile, groups narrower than a K tile
        (40, 65, 96, None, False),  # a 64-row tile
    ],
)
def test_triton_matches_reference(device: str, m: int, n: int, k: int, group: int | None,
                                  bias: bool) -> None:
    weight = fp8_weight(n, k, group, device)
    x = torch.randn(m, k, device=device)
    b = torch.randn(n, device=device) if bias else None
    torch.testing.assert_close(fp8_matmul(x, weight, b), fp8_matmul_reference(x, weight, b),
                               rtol=1e-4, atol=1e-4)


def test_every_finite_encoding_converts_exactly(device: str) -> None:
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    stored = torch.zeros(finite.numel(), 40, dtype=torch.uint8)
    stored[:, 37] = finite
    weight = Fp8Weight(stored.view(FP8_DTYPE).to(device),
                       torch.ones(finite.numel(), 1, device=device), 40)
    x = torch.zeros(1, 40, device=device)
    x[0, 37] = 1.0
    assert torch.equal(fp8_matmul(x, weight).cpu(), finite.view(FP8_DTYPE).float()[None])


def test_triton_bfloat16_activations(device: str) -> None:
    weight = fp8_weight(24, 64, None, device)
    x = torch.randn(2, 64, device=device, dtype=torch.bfloat16)
    got = fp8_matmul(x, weight)
    assert got.dtype == torch.bfloat16
    # the kernel rounds the scaled weight to bfloat16 before the product
    torch.testing.assert_close(got.float(), fp8_matmul_reference(x, weight).float(),
                               rtol=2e-2, atol=5e-2)
