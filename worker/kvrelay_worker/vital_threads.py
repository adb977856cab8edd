"""The threads a worker cannot serve without; the death of one ends the process.

The engine thread steps every job, the publisher writes every event, the lease keeper
keeps the leases and the control listener hears cancels. When one of them dies (an
error nothing catches), the process would go on holding its jobs and their Celery
slots while their streams hang: the leases of a dead publisher's jobs were still
refreshed, so no other worker took them over. Ending the process instead lets their
leases run out: live workers take the jobs over and continue them from their logs, as
after a crash, and the supervisor starts a fresh process. The exit status says why.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# EX_SOFTWARE: "an internal software error", distinct from a lost device's status.
DEAD_THREAD_EXIT_CODE = 70
# How often the threads are looked at: well within any lease.
CHECK_EVERY_S = 0.25


def exit_for_dead_thread(name: str) -> None:
    """Log why, flush, and end the process with ``DEAD_THREAD_EXIT_CODE`` (no drain: it
    would wait on a thread that is gone)."""
    log.critical("the worker's %s thread died; the worker exits with status %d so that "
                 "its jobs are taken over by other workers", name, DEAD_THREAD_EXIT_CODE)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(DEAD_THREAD_EXIT_CODE)


class VitalThreads:
    """Watches ``alive`` (name -> whether that thread runs) and calls ``on_death(name)``
    once, for the first that stopped before ``stop`` was called."""

    def __init__(self, alive: Mapping[str, Callable[[], bool]],
                 on_death: Callable[[str], None]) -> None:
        self.alive = dict(alive)
        self.on_death = on_death
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvrelay-vital", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def dead(self) -> str | None:
        """The first watched thread that is not running (None: all run)."""
        return next((name for name, alive in self.alive.items() if not alive()), None)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            name = self.dead()
            if name is not None and not self._stop.is_set():
                self.on_death(name)
                return
