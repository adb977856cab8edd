"""The environment that puts ``helpers/injected/sitecustomize.py`` into a worker process
(a skewed wall clock, a thread killed on cue), and the worker settings these tests share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from helpers.worker_process import WorkerProcess

FOLDER = Path(__file__).parent / "injected"
# A simulated engine (no weights: starts in about a second) with short leases.
FAST: dict[str, Any] = {"concurrency": 4, "simulated_step_ms": 20, "lease_ttl": 2.0, "lease_refresh": 0.5,
        "watchdog_interval": 0.5}


def inject(worker: WorkerProcess, **faults: str) -> WorkerProcess:
    """Give ``worker`` (not started yet) the faults ``TEST_FAULT_<NAME>=value``."""
    worker.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(FOLDER), worker.env.get("PYTHONPATH", "")) if p)
    for name, value in faults.items():
        worker.env[f"TEST_FAULT_{name.upper()}"] = value
    return worker
