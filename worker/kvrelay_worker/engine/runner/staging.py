"""A pinned host buffer reused step after step for copies to the device, behind a fence.

A non-blocking copy from pinned memory is only *queued*: the device reads the host
buffer later, when the stream reaches the copy. Writing the next step's inputs into the
same buffer before then changes what the queued copy reads. Something usually
synchronises in between (the sampler reads tokens back), but not always: a step in which
no row samples reads nothing back. So every copy out of the buffer records an event, and
the buffer is handed out for writing only once that event has completed.

On the CPU there is nothing to fence: the copy has finished when ``copy_`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class Fence(Protocol):
    """What the buffer needs of an event (``torch.cuda.Event`` fits)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class StagingBuffer:
    """A flat host tensor of ``numel`` elements; views of it are copied to the device.

    Protocol: ``writable(shape)`` (waits for the last copy out of the buffer, then returns
    a contiguous view of the first ``prod(shape)`` elements), fill it, ``copy_to(dst,
    view)``. ``new_fence`` makes the event (tests pass a fake); the default is a CUDA
    event on CUDA and none elsewhere.
    """

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device,
                 new_fence: Callable[[], Fence] | None = None) -> None:
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(numel, dtype=dtype, pin_memory=on_cuda)
        if new_fence is None and on_cuda:
            new_fence = torch.cuda.Event
        self._fence: Fence | None = new_fence() if new_fence is not None else None
        self._pending = False

    def writable(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A view of the buffer to fill, once no queued copy still reads it."""
        if self._pending:
            assert self._fence is not None
            self._fence.synchronize()
            self._pending = False
        numel = 1
        for size in shape:
            numel *= size
        return self.host[:numel].view(shape)

    def copy_to(self, dst: torch.Tensor, view: torch.Tensor) -> None:
        """Queue ``dst.copy_(view)`` and fence it (``view`` from ``writable``)."""
        dst.copy_(view, non_blocking=True)
        if self._fence is not None:
            self._fence.record()
            self._pending = True
