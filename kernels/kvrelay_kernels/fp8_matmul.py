"""Public entry point of FP8-weight matmuls (float8_e4m3fn weights kept as stored).

- CUDA, compute capability 8.9+: FP8 matmuls (``fp8_scaled_mm``), activations quantized
  per token or with the checkpoint's static scale, as vLLM serves these checkpoints;
- other GPUs (and layouts the FP8 matmul does not take: 128x128 blocks, weight-only
  checkpoints): the Triton kernel, which loads the FP8 bytes as uint8 and converts them in
  its tile loop (no native FP8 needed);
- CPU: the C++ kernel (``cpu_fp8_matmul``), weight-only;
- ``KVRELAY_KERNELS=reference``, or no compiler: the PyTorch reference, weight-only.
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
from kvrelay_kernels.fp8_scaled_mm import (
    fp8_matmul_supported,
    fp8_scaled_matmul,
    scaled_mm_serves,
)
from kvrelay_kernels.fp8_weight import Fp8Weight
from kvrelay_kernels.reference.fp8_matmul import fp8_matmul_reference


def fp8_matmul(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None, *,
               weight_checked: bool = False) -> torch.Tensor:
    """``x @ W.T + bias`` for an FP8 ``W``; ``x`` is ``[..., in_features]``.

    ``weight_checked``: the caller has run ``weight.check()`` on these very tensors."""
    if not weight_checked:
        weight.check()
    check_dtype("x", x, FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] != weight.in_features:
        raise KernelArgumentError(
            f"x must end in in_features={weight.in_features}, got shape {tuple(x.shape)}")
    check_same_device(x=x, weight=weight.weight)
    if bias is not None:
        check_shape("bias", bias, (weight.out_features,))
        check_same_device(x=x, bias=bias)
    lead = x.shape[:-1]
    out = _matmul_2d(x.reshape(-1, weight.in_features).contiguous(), weight, bias)
    return out.reshape(*lead, weight.out_features)


def _matmul_2d(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    if x.shape[0] == 0:
        return torch.empty((0, weight.out_features), dtype=x.dtype, device=x.device)
    backend = select_backend(x.device)
    if (backend == "triton" and fp8_matmul_supported(x.device)
            and scaled_mm_serves(weight)):
        return fp8_scaled_matmul(x, weight, bias)
    if backend == "triton":
        from kvrelay_kernels.triton_kernels.fp8_matmul import fp8_matmul_triton

        return fp8_matmul_triton(x, weight, bias)
    if x.device.type == "cpu" and cpu_kernels_allowed():
        from kvrelay_kernels.cpu_fp8_matmul import fp8_matmul_cpu

        out = fp8_matmul_cpu(x, weight, bias)
        if out is not None:
            return out
    return fp8_matmul_reference(x, weight, bias)
