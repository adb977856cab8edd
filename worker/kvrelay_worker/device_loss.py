"""A worker whose GPU hit a sticky error leaves, so that its jobs move to healthy workers.

After such an error (``engine/runner/device_errors.py``) every step fails, so the worker could
only fail each job it holds and every job it picks up later. Exiting at once instead
leaves the jobs' leases to expire: live workers then take them over and continue them
from their logs, as after a crash, and the supervisor (Compose's restart policy, systemd,
Kubernetes) starts a fresh process with a fresh CUDA context. The exit status says why.
Nothing else is attempted on the way out: a drain would wait on steps that can only fail,
and interpreter teardown could touch the poisoned context.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

# EX_SOFTWARE-adjacent and distinct from Celery's own codes: "the device was lost".
DEVICE_LOST_EXIT_CODE = 75


def exit_for_device_loss(exc: BaseException) -> None:
    """Log why, flush, and end the process with ``DEVICE_LOST_EXIT_CODE``."""
    log.critical("the GPU hit an unrecoverable error (%r); the worker exits with status %d "
                 "so that its jobs are taken over by other workers", exc,
                 DEVICE_LOST_EXIT_CODE)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(DEVICE_LOST_EXIT_CODE)
