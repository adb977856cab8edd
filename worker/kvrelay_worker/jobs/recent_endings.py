"""The jobs this worker ended lately, so their ends can be written again after an outage.

A Redis that restarts from an AOF fsynced once a second, or a failover to a replica that
had not caught up, can lose writes it acknowledged: among them the release that marked a
job done. The record then reads ``running`` (or the job was never claimed at all), the
lease takeover or the dead-delivery watch hands the job out again, and a job whose caller
already has every token runs a second time (chaos seed 10012: two AOF restarts beside a
worker kill). The worker that ended the job still knows: once its writes get through
again after a failure, it writes again the end of every job it ended shortly before
(``lease_scripts.REASSERT_END``), within a lease, before any watch (which waits a whole
lease after its own outage) looks at the job.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

# How long an ending is kept: longer than any write a restart or failover may lose
# (an AOF fsync period, a replica's lag) plus a lease, for the outage's detection.
KEEP_S: Final = 60.0


class RecentEndings:
    """(job id, run id, when) of the jobs this worker's runs ended, for ``KEEP_S``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ended: deque[tuple[float, str, str]] = deque()

    def add(self, job_id: str, run: str) -> None:
        now = self._clock()
        with self._lock:
            self._ended.append((now, job_id, run))
            while self._ended and self._ended[0][0] < now - KEEP_S:
                self._ended.popleft()

    def since(self, when: float) -> list[tuple[str, str, float]]:
        """The (job id, run id, when) of the jobs ended at or after ``when`` (the clock's
        time)."""
        with self._lock:
            return [(job_id, run, at) for at, job_id, run in self._ended if at >= when]
