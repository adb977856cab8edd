"""RMSNorm, alone and fused with the residual add, computed as Hugging Face does."""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)``, with the statistics in float32 whatever ``x``'s dtype."""
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    xf = xf * torch.rsqrt(variance + eps)
    return weight * xf.to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(rms_norm(residual + x), residual + x)``: the pre-norm block's two outputs."""
    summed = residual + x
    return rms_norm_reference(summed, weight, eps), summed
