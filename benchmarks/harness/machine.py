"""The machine and the commit a result was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]


def git_commit(folder: Path = REPOSITORY) -> str:
    """The checked-out commit, with ``+dirty`` when tracked files differ from it;
    ``unknown`` outside a git checkout (a copied tree on a GPU host)."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info() -> dict[str, Any]:
    """CPU, Python and, where the benchmark loaded them, torch and its devices (torch is
    never imported here: a client-only benchmark must not pay for it)."""
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "processor": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_interop_threads"] = torch.get_num_interop_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    for name in ("transformers", "triton"):
        module = sys.modules.get(name)
        if module is not None:
            info[name] = getattr(module, "__version__", None)
    return info
