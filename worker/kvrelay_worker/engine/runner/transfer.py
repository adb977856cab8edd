"""Host-to-device copies that do not stall the host."""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``; ``t`` itself on the CPU.

    On CUDA the copy goes through pinned memory with ``non_blocking=True``, so it is
    queued on the stream instead of making the host wait (a copy from pageable memory
    blocks). Each call stages through a fresh pinned tensor from torch's pinned-memory
    allocator, which records an event with the copy and does not hand that memory out
    again until the event has completed: no fence of our own is needed here (buffers
    reused on purpose go through ``engine.staging.StagingBuffer``).
    """
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
