"""What a CUDA device's compute capability allows, checked when the engine is configured.

- float8 (e4m3) conversions, which a ``kv_cache_dtype="fp8_e4m3"`` cache needs in every
  store and attention kernel, exist from compute capability 8.9 (Ada, Hopper): on an
  older GPU the first step would fail to compile, so the configuration is refused with
  the alternative named.
- ``torch.nn.functional.grouped_mm`` (the MoE experts in one call) runs on CUDA from 9.0
  (Hopper); before that the MoE layer takes its per-expert loop (``models/moe.py``).
"""

from __future__ import annotations

import functools

import torch

from kvrelay_worker.engine.errors import EngineConfigError

FP8_KV_MIN_CAPABILITY = (8, 9)
GROUPED_MM_MIN_CAPABILITY = (9, 0)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA device; None for any other device."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None
                       else torch.cuda.current_device())


def check_kv_cache_dtype(kv_cache_dtype: str, device: torch.device) -> None:
    """Refuse an fp8 KV cache on a GPU without float8 conversions."""
    if kv_cache_dtype != "fp8_e4m3":
        return
    capability = cuda_capability(device)
    if capability is not None and capability < FP8_KV_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_KV_MIN_CAPABILITY))
        raise EngineConfigError(
            f"kv_cache_dtype='fp8_e4m3' needs a GPU of compute capability {need} or newer "
            f"(Ada, Hopper); {device} is {capability[0]}.{capability[1]}: use "
            "kv_cache_dtype='int8' (the same memory, integer rows) or 'auto'")


def grouped_mm_supported(device: torch.device) -> bool:
    """Whether ``grouped_mm`` runs on ``device`` (the CPU always; CUDA from 9.0)."""
    capability = cuda_capability(device)
    return capability is None or capability >= GROUPED_MM_MIN_CAPABILITY
