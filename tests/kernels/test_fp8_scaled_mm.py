"""The FP8-matmul path (``torch._scaled_mm``): its arguments, and its numbers.

torch 2.13's CPU build runs ``_scaled_mm`` on CPU tensors (tensor-wise and row-wise), so
the numbers are checked here against the arithmetic it promises (``fp8_w8a8_reference``:
activations quantized per token or with the static scale, exact products, both scales).
The CPU kernel does not check what CUDA requires (row-major activations, a column-major
weight, K and N multiples of 16, scale shapes and dtypes): those checks are torch's
own ``_scaled_mm`` meta function, run on fake CUDA tensors (``FakeTensorMode``, which
needs no GPU); a row-major weight is refused by it, so the check is live. On a GPU with
FP8 (compute capability 8.9+) the door's own product is compared too.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kvrelay_kernels.fp8_matmul import fp8_matmul
from kvrelay_kernels.fp8_scaled_mm import (
    fp8_matmul_supported,
    fp8_scaled_matmul,
    scaled_mm_args,
    scaled_mm_serves,
)
from kvrelay_kernels.fp8_weight import FP8_DTYPE, Fp8Weight
from kvrelay_kernels.reference.fp8_matmul import fp8_matmul_reference, fp8_w8a8_reference

ACTIVATIONS = ("dynamic", "static")


def fp8_weight(n: int, k: int, activations: str, device: str = "cpu") -> Fp8Weight:
    values = torch.randn(n, k) * 100
    scale = torch.tensor(0.02) if activations == "static" else None
    return Fp8Weight(values.clamp(-448, 448).to(FP8_DTYPE).to(device),
                     (torch.rand(n, 1) * 0.01 + 1e-3).to(device), k, activations,
                     None if scale is None else scale.to(device))


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_scaled_mm_computes_the_w8a8_product(activations: str, dtype: torch.dtype,
                                             rows: int) -> None:
    torch.manual_seed(rows)
    weight = fp8_weight(48, 64, activations)
    x = (torch.randn(rows, 64) * 2).to(dtype)
    bias = torch.randn(48)
    got = fp8_scaled_matmul(x, weight, bias)
    assert got.dtype == dtype
    expected = fp8_w8a8_reference(x, weight, bias)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # the bfloat16 result's rounding
    torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance,
                               atol=tolerance * expected.abs().max().item())
    # and it is the weight-only product up to FP8 activations' rounding (3 mantissa bits)
    exact = fp8_matmul_reference(x.float(), weight, bias)
    assert (got.float() - exact).abs().max() < 0.1 * exact.abs().max()


@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7])
def test_arguments_pass_torchs_cuda_checks(activations: str, dtype: torch.dtype,
                                           rows: int) -> None:
    with FakeTensorMode():  # tensors made inside: fake CUDA ones, shapes and strides only
        scale = torch.empty((), device="cuda") if activations == "static" else None
        weight = Fp8Weight(torch.empty(48, 64, dtype=FP8_DTYPE, device="cuda"),
                           torch.empty(48, 1, device="cuda"), 64, activations, scale)
        weight.check()
        x = torch.empty(rows, 64, dtype=dtype, device="cuda")
        args = scaled_mm_args(x, weight)
        assert args.b.stride() == (1, 64)  # the stored weight, viewed column-major
        out = torch._scaled_mm(args.a, args.b, scale_a=args.scale_a, scale_b=args.scale_b,
                               out_dtype=args.out_dtype)
        assert tuple(out.shape) == (rows, 48)
        row_major = torch.empty(64, 48, dtype=FP8_DTYPE, device="cuda")
        with pytest.raises(RuntimeError, match="col_major"):
            torch._scaled_mm(args.a, row_major, scale_a=args.scale_a, scale_b=args.scale_b,
                             out_dtype=args.out_dtype)


def test_only_per_channel_quantized_activations_and_multiples_of_16_take_it() -> None:
    assert scaled_mm_serves(fp8_weight(48, 64, "dynamic"))
    assert not scaled_mm_serves(fp8_weight(48, 72, "dynamic"))  # K = 72
    weight_only = fp8_weight(48, 64, "dynamic")
    assert not scaled_mm_serves(Fp8Weight(weight_only.weight, weight_only.scales, 64))
    blocks = Fp8Weight(weight_only.weight, torch.ones(48, 2), 32, "dynamic")
    assert not scaled_mm_serves(blocks)
    assert not fp8_matmul_supported(torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available()
                         and fp8_matmul_supported(torch.device("cuda"))),
                    reason="needs a GPU with FP8 matmuls (compute capability 8.9+)")
@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_door_uses_fp8_matmuls_on_the_gpu(activations: str, dtype: torch.dtype) -> None:
    weight = fp8_weight(4096, 1024, activations, "cuda")
    x = torch.randn(3, 1024, device="cuda").to(dtype)
    got = fp8_matmul(x, weight)
    expected = fp8_w8a8_reference(x, weight)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2,
                               atol=1e-2 * expected.abs().max().item())
