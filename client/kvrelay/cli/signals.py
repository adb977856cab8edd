"""SIGTERM and SIGHUP stop a command the way Ctrl-C does, so one ``finally`` cleans up
after all three; while cleaning up, further interrupts are held off.

SIGINT is handled explicitly too: a shell starts background jobs with SIGINT ignored, and
Python keeps it ignored, but ``kvrelay up --serve`` must stop on SIGINT wherever it runs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt``."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, *_STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, Ctrl-C, SIGTERM and SIGHUP are ignored (cleanup must finish)."""
    signals = (signal.SIGINT, *_STOP_SIGNALS)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
