"""The CPU threading the engine's matmuls run under, as one line for the worker's log.

On CPU the decode and prefill speed depends as much on these settings as on the code:
torch's intra-op pool (the matmuls), its inter-op pool, and the OpenMP / MKL variables that
pin or size them. The engine changes none of them; it reports what it found so that a slow
worker can be explained from its start line.
"""

from __future__ import annotations

import os

import torch

# Environment variables that change how torch's CPU thread pools size or pin themselves.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "OMP_WAIT_POLICY",
    "GOMP_CPU_AFFINITY",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "MKL_NUM_THREADS",
)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_thread_settings() -> dict[str, int | str]:
    """Intra-op and inter-op thread counts, usable CPUs, and each thread variable that is set."""
    settings: dict[str, int | str] = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "usable_cpus": usable_cpus(),
    }
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name)
        if value is not None:
            settings[name] = value
    return settings


def describe_cpu_threads() -> str:
    """``intra-op 2, inter-op 2, of 2 CPUs[, OMP_NUM_THREADS=1 ...]`` for a log line."""
    settings = cpu_thread_settings()
    text = (f"intra-op {settings['intra_op_threads']}, inter-op {settings['inter_op_threads']}, "
            f"of {settings['usable_cpus']} CPUs")
    env = [f"{name}={settings[name]}" for name in THREAD_ENV_VARS if name in settings]
    return f"{text}, {' '.join(env)}" if env else f"{text}, no OMP/KMP/MKL variables set"
