"""Host-to-device copies that do not stall the host."""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``; ``t`` itself on the CPU.

    On CUDA the copy goes through pinned memory with ``non_blocking=True``, so it is
    queued on the stream instead of making the host wait (a copy from pageable memory
    blocks). The pinned staging buffer stays reserved until the copy has run.
    """
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
