"""The CPU threading the engine's matmuls run under: chosen before the model loads, and
reported as one line for the worker's log.

On CPU the decode and prefill speed depends as much on these settings as on the code:
torch's intra-op pool (the matmuls and every kernel's ``at::parallel_for``), its inter-op
pool, and the OpenMP / MKL variables that pin or size them. torch sizes the intra-op pool
from the machine's cores, ignoring the affinity mask and cgroup quota a container or
``taskset`` gives the process; so the worker and the offline ``LLM`` set it themselves
(``KVRELAY_CPU_THREADS``, else the usable CPUs), unless ``OMP_NUM_THREADS`` asks for a
count already. The line says what was chosen and why, so a slow worker can be explained
from its start line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from kvrelay_worker.usable_cpus import UsableCpus, usable_cpus

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
WORKER_SETTING = "KVRELAY_CPU_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count to set (None: leave torch's) and why, for the start line."""

    count: int | None
    reason: str


def choose_cpu_threads(setting: int | None, environ: Mapping[str, str] | None = None,
                       cpus: Callable[[], UsableCpus] = usable_cpus,
                       name: str = WORKER_SETTING, current: int | None = None) -> ThreadChoice:
    """``setting`` (``KVRELAY_CPU_THREADS`` / ``LLM(cpu_threads=)``) when given; else nothing
    when ``OMP_NUM_THREADS`` is set (torch already sized its pool as the user asked);
    else the CPUs the process may use (affinity mask and cgroup quota). ``current``, when
    given, is a count to keep if the usable CPUs are not fewer (the offline ``LLM`` passes
    torch's, so a script's ``torch.set_num_threads(2)`` stays). ``name`` is the setting's
    name in the reason and the error."""
    if setting is not None:
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ValueError(f"{name} must be a positive integer, got {setting!r}")
        return ThreadChoice(setting, f"{name}={setting}")
    env = os.environ if environ is None else environ
    omp = env.get("OMP_NUM_THREADS")
    if omp:
        return ThreadChoice(None, f"{name} unset, torch's from OMP_NUM_THREADS={omp}")
    usable = cpus()
    if current is not None and current <= usable.count:
        return ThreadChoice(None, f"{name} unset, torch's {current}: within {usable.describe()}")
    return ThreadChoice(usable.count, f"{name} unset: {usable.describe()}")


def apply_cpu_threads(setting: int | None, environ: Mapping[str, str] | None = None,
                      name: str = WORKER_SETTING, keep_lower: bool = False) -> ThreadChoice:
    """Choose and set torch's intra-op thread count (``keep_lower``: keep torch's count when
    it is not above the usable CPUs); call before the first torch op of the threads that
    compute (each thread picks the process-wide count up at its first ``at::parallel_for``,
    so the engine thread started afterwards runs with it)."""
    current = torch.get_num_threads() if keep_lower else None
    choice = choose_cpu_threads(setting, environ, name=name, current=current)
    if choice.count is not None:
        torch.set_num_threads(choice.count)
    return choice


def cpu_thread_settings() -> dict[str, int | str]:
    """Intra-op and inter-op thread counts, usable CPUs, and each thread variable that is set."""
    settings: dict[str, int | str] = {
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "usable_cpus": usable_cpus().count,
    }
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name)
        if value is not None:
            settings[name] = value
    return settings


def describe_cpu_threads(choice: ThreadChoice | None = None) -> str:
    """``intra-op 2 (why), inter-op 2, of 2 usable CPUs[, OMP_NUM_THREADS=1 ...]``."""
    settings = cpu_thread_settings()
    why = f" ({choice.reason})" if choice is not None else ""
    text = (f"intra-op {settings['intra_op_threads']}{why}, "
            f"inter-op {settings['inter_op_threads']}, of {settings['usable_cpus']} usable CPUs")
    env = [f"{name}={settings[name]}" for name in THREAD_ENV_VARS if name in settings]
    return f"{text}, {' '.join(env)}" if env else f"{text}, no OMP/KMP/MKL variables set"
