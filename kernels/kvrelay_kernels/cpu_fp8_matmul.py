"""FP8-weight matmul on CPU: the C++ kernel ``cpu_kernels/fp8_linear.cpp``.

Weight-only: activations stay float32 and each FP8 weight is converted to float inside
the kernel's loop (dot products for few rows, dequantized cache-sized tiles and the float
GEMM for more), never into a float copy of the matrix. That is more accurate than the
checkpoint's own activation quantization (per token or static FP8), which only the GPU's
FP8 matmuls apply. The kernel picks AVX-512, AVX2 or scalar code from the CPU's features
at run time; ``isa`` forces one of ``fp8_isas()`` (tests).
"""

from __future__ import annotations

import torch

from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.fp8_weight import Fp8Weight


def fp8_isas() -> list[str]:
    """The kernel's code paths this CPU runs, best first (empty without the extension)."""
    if not load_cpu_kernels():
        return []
    return list(torch.ops.kvrelay_cpu.fp8_linear_isas())


def fp8_matmul_cpu(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
                   isa: str = "auto") -> torch.Tensor | None:
    """``x @ dequantize(weight).T + bias`` (2-D ``x``), or None without the extension."""
    if not load_cpu_kernels():
        return None
    out = torch.ops.kvrelay_cpu.fp8_linear(
        x.float().contiguous(), weight.weight, weight.scales, weight.group_size,
        None if bias is None else bias.float().contiguous(), isa)
    return out.to(x.dtype)
