"""The Triton RMSNorm kernels against the Hugging Face-style reference."""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels.reference.norm import fused_add_rms_norm_reference, rms_norm_reference
from kvrelay_kernels.triton_kernels.norm import fused_add_rms_norm_triton, rms_norm_triton

# One rounding step of the dtype: the kernel's rsqrt may differ from torch's in the last
# float32 bit, which can flip a rounding of the normalised value.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@pytest.mark.parametrize(
    ("shape", "dtype", "weight_dtype"),
    [
        ((7, 64), torch.float32, torch.float32),
        ((3, 5, 100), torch.bfloat16, torch.bfloat16),  # 3-D, width not a power of two
        ((4, 576), torch.float16, torch.float16),
        ((2, 4096), torch.bfloat16, torch.float32),  # float32 weight promotes the output
    ],
)
def test_rms_norm(shape, dtype, weight_dtype, device):
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    weight = (1 + torch.randn(shape[-1], device=device) * 0.1).to(weight_dtype)
    expected = rms_norm_reference(x, weight, 1e-6)
    got = rms_norm_triton(x, weight, 1e-6)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


def test_rms_norm_strided_rows(device):
    wide = torch.randn(6, 256, device=device)
    x = wide[:, :192]  # rows strided by 256
    weight = torch.rand(192, device=device)
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-5),
                               rms_norm_reference(x, weight, 1e-5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((5, 64), torch.float32), ((2, 3, 96), torch.bfloat16), ((4, 1000), torch.float16)],
)
def test_fused_add_rms_norm(shape, dtype, device):
    x = torch.randn(shape, device=device).to(dtype)
    residual = (torch.randn(shape, device=device) * 4).to(dtype)
    weight = torch.rand(shape[-1], device=device).to(dtype)
    x_before, residual_before = x.clone(), residual.clone()
    expected_out, expected_sum = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    got_out, got_sum = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    if dtype == torch.bfloat16:
        # Triton's CPU interpreter truncates float32 -> bfloat16 instead of rounding to
        # nearest, so it may be one unit in the last place off; GPUs round.
        torch.testing.assert_close(got_sum, expected_sum, atol=0, rtol=2**-7)
    else:
        assert torch.equal(got_sum, expected_sum)  # one rounding of the same float32 sum
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got_out, expected_out, atol=atol, rtol=rtol)
    assert torch.equal(x, x_before)
    assert torch.equal(residual, residual_before)
