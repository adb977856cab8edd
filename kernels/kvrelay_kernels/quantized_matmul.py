"""Public entry point of weight-only quantized matmuls (int8 / int4 weights, float inputs).

CUDA tensors take the Triton W8A16/W4A16 kernel (dequantization fused into its tile
loop); CPU tensors take the C++ kernels of ``cpu_quantized_matmul`` (integer dot products
for few rows, an int16 GEMM or dequantized tiles and the float GEMM for more) unless
``KVRELAY_KERNELS`` forces the reference, which is also where a machine without a C++
compiler ends up.
"""

from __future__ import annotations

import torch

from kvrelay_kernels.backend import cpu_kernels_allowed, select_backend
from kvrelay_kernels.checks import (
    FLOAT_DTYPES,
    KernelArgumentError,
    check_dtype,
    check_same_device,
    check_shape,
)
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_kernels.reference.quantized_matmul import quantized_matmul_reference


def quantized_matmul(x: torch.Tensor, weight: QuantizedWeight,
                     bias: torch.Tensor | None = None, *,
                     weight_checked: bool = False) -> torch.Tensor:
    """``x @ W.T + bias`` for a quantized ``W``; ``x`` is ``[..., in_features]``.

    ``weight_checked``: the caller has run ``weight.check()`` on these very tensors (a
    layer does at construction), so it is not run again on every call of a decode step.
    """
    if not weight_checked:
        weight.check()
    check_dtype("x", x, FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] != weight.in_features:
        raise KernelArgumentError(
            f"x must end in in_features={weight.in_features}, got shape {tuple(x.shape)}"
        )
    check_same_device(x=x, qweight=weight.qweight)
    if bias is not None:
        check_shape("bias", bias, (weight.out_features,))
        check_same_device(x=x, bias=bias)
    lead = x.shape[:-1]
    rows = x.reshape(-1, weight.in_features)
    out = _matmul_2d(rows.contiguous(), weight, bias)
    return out.reshape(*lead, weight.out_features)


def _matmul_2d(x: torch.Tensor, weight: QuantizedWeight,
               bias: torch.Tensor | None) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty((0, weight.out_features), dtype=x.dtype, device=x.device)
    backend = select_backend(x.device)
    if backend == "triton":
        from kvrelay_kernels.triton_kernels.quantized_matmul import quantized_matmul_triton

        return quantized_matmul_triton(x, weight, bias)
    if x.device.type == "cpu" and cpu_kernels_allowed():
        from kvrelay_kernels.cpu_quantized_matmul import quantized_matmul_cpu

        out = quantized_matmul_cpu(x, weight, bias)
        if out is not None:
            return out
    return quantized_matmul_reference(x, weight, bias)
