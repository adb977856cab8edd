"""Make an engine's CUDA device the current one of the thread that builds and steps it.

``torch.cuda`` keeps a *current device* per thread, and several things follow it rather
than the tensors they touch: Triton launches on the current device, and
``torch.cuda.graph_pool_handle()``, ``torch.cuda.Stream()`` and
``torch.cuda.Event()`` are created there. An engine on ``cuda:1`` whose thread still
has device 0 current would capture graphs and launch kernels on device 0 with device-1
pointers. So the engine thread sets its device before it builds anything.

``torch.cuda.set_device`` accepts only an index (or a ``torch.device`` that has one):
``device="cuda"`` and ``"auto"`` name *the current device*, so they are given its index
once, when the configuration is read, and the engine keeps that indexed device.
"""

from __future__ import annotations

import torch


def indexed_device(device: torch.device) -> torch.device:
    """``device`` with an index when it is CUDA: ``cuda`` alone becomes the current one.

    Without CUDA the device is returned as it is, so the configuration can say clearly
    that CUDA is missing rather than fail inside torch.
    """
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def bind_device(device: torch.device) -> None:
    """Set ``device`` as this thread's current CUDA device (nothing to do elsewhere)."""
    if device.type == "cuda":
        torch.cuda.set_device(indexed_device(device))
