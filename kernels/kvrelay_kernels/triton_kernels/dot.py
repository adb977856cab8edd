# mypy: disable-error-code="no-untyped-def"
# (@triton.jit functions take Triton IR values; their parameters cannot carry Python types.)
"""The one matrix product the attention kernels use, with its precision chosen per dtype.

- float32 inputs must not be rounded to TF32 on the GPU: the references compute in full
  float32, so those products ask for IEEE precision.
- Triton's CPU interpreter multiplies bfloat16 operands as their raw 16-bit integers; there
  the operands are widened to float32 first (exact: a product of two bfloat16 values fits
  in float32), which gives what the GPU's bfloat16 tensor cores give.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvrelay_kernels.triton_kernels.launch_config import interpreting


@triton.jit
def mma(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``a @ b`` accumulated in float32; both operands share one dtype."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


def mma_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def mma_widen(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and interpreting()
