"""Leave the process as soon as the worker has shut down, without interpreter teardown.

When Celery sends ``worker_shutdown`` the worker is done: running jobs drained or handed
back, every event written, the runtime stopped, the exit code decided. What is left is
Python unloading torch, transformers and the engine module by module, which takes most
of a stopping worker's time (far longer than the drain itself), while a supervisor or a
rolling deploy waits and the memory stays held. So the last ``atexit`` hook registered, which runs first, flushes the logs and
standard streams and ends the process with that code.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any

from celery import signals


def install() -> None:
    """Exit right after Celery's shutdown (idempotent: Celery's signal keeps one receiver)."""
    signals.worker_shutdown.connect(_after_worker_shutdown, weak=False,
                                    dispatch_uid="kvrelay-fast-exit")


def _after_worker_shutdown(sender: Any = None, **_: object) -> None:
    code = getattr(sender, "exitcode", None)
    atexit.register(_exit_now, code if isinstance(code, int) else 0)


def _exit_now(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can be written
            pass
    os._exit(code)
