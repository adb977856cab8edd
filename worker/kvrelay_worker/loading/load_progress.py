"""How far a weight load has got: a bar on a terminal, log lines for everyone else.

An 8B model takes tens of seconds to read even from a warm disk, and a worker's log is
usually a container's, not a terminal: without a line there, an operator cannot tell a
slow load from a hung one. So a load that lasts longer than ``QUIET_SECONDS`` logs its
progress every ``LOG_EVERY_SECONDS`` (bytes read, share, rate) and once when done; a short
load logs nothing extra. With ``progress`` and a terminal on stderr a ``tqdm`` bar is shown
too (off with ``HF_HUB_DISABLE_PROGRESS_BARS=1``, as the Hub's download bars are).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from types import TracebackType

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

QUIET_SECONDS = 3.0
LOG_EVERY_SECONDS = 5.0


class LoadProgress:
    """Counts the bytes of weights read out of ``total`` (a context manager)."""

    def __init__(self, total: int, label: str, *, progress: bool = False) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.began = time.monotonic()
        self._next_log = self.began + QUIET_SECONDS
        self._logged = False
        show = (progress and sys.stderr.isatty()
                and os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "") in ("", "0"))
        self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"Loading {label}",
                         disable=not show, leave=False)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self._bar.update(nbytes)
        now = time.monotonic()
        if now >= self._next_log:
            self._next_log = now + LOG_EVERY_SECONDS
            self._logged = True
            log.info("loading %s: %s", self.label, self.describe(now))

    def describe(self, now: float | None = None) -> str:
        """``"215.0 of 538.1 MiB (40%), 96.2 MiB/s"``."""
        elapsed = max((now if now is not None else time.monotonic()) - self.began, 1e-9)
        mib = 2**20
        return (f"{self.done / mib:.1f} of {self.total / mib:.1f} MiB "
                f"({100 * self.done / self.total:.0f}%), {self.done / mib / elapsed:.1f} MiB/s")

    def __enter__(self) -> LoadProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._bar.close()
        if kind is None and self._logged:
            log.info("loaded %s: %s in %.1f s", self.label, self.describe(),
                     time.monotonic() - self.began)
