"""A step's duration as a decoding stream waits for it: until its device work is done.

On CUDA the host returns from a step as soon as its kernels are queued, unless something
read a result back (the sampled tokens do). A step in which no row samples (prompt
chunks only) would then be timed at its launch cost, and the prefill pacer and the
speculation step-time curve, which learn from these times, would learn launch time
instead of GPU time. So before the clock is read, the timer waits for an event recorded
after the step's work on the device's current stream (only that stream, not the device).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def wait_for_cuda_stream(device: torch.device) -> Callable[[], None]:
    """Waits until the work queued so far on ``device``'s current stream is done."""
    def wait() -> None:
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()
    return wait


def _nothing_to_wait_for() -> None:
    return None


class StepTimer:
    """``start()`` then ``elapsed_ms()``: host time up to the end of the device's work."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 wait_for_device: Callable[[], None] = _nothing_to_wait_for) -> None:
        self.clock = clock
        self.wait_for_device = wait_for_device
        self._started = 0.0

    @classmethod
    def for_device(cls, device: torch.device) -> StepTimer:
        if device.type == "cuda":
            return cls(wait_for_device=wait_for_cuda_stream(device))
        return cls()

    def start(self) -> None:
        self._started = self.clock()

    def elapsed_ms(self) -> float:
        self.wait_for_device()
        return (self.clock() - self._started) * 1e3
