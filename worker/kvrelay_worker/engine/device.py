"""Make an engine's CUDA device the current one of the thread that builds and steps it.

``torch.cuda`` keeps a *current device* per thread, and several things follow it rather
than the tensors they touch: Triton launches on the current device, and
``torch.cuda.graph_pool_handle()``, ``torch.cuda.Stream()`` and
``torch.cuda.Event()`` are created there. An engine on ``cuda:1`` whose thread still
has device 0 current would capture graphs and launch kernels on device 0 with device-1
pointers. So the engine thread sets its device before it builds anything.
"""

from __future__ import annotations

import torch


def bind_device(device: torch.device) -> None:
    """Set ``device`` as this thread's current CUDA device (nothing to do elsewhere)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
