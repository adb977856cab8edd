"""Child processes that cannot outlive the CLI: own process group, killed with their parent.

Each child runs in a process group of its own, so a Ctrl-C in the terminal reaches only
the CLI, which then stops the children in order (worker first, then Redis) instead of all
of them at once. On Linux the kernel also kills a child when the CLI dies without
cleaning up (SIGKILL, a crash): ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec (async-signal-safe calls only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group; its stdout and stderr go to ``log``, else to
    this process's stderr (never to stdout, which carries the CLI's own output)."""
    parent = os.getpid()
    preexec = (lambda: _die_with_parent(parent)) if sys.platform.startswith("linux") else None
    out: IO[Any] | None = None
    if log is not None:
        out = log.open("ab")
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out if out is not None else _stderr_fd(),
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=preexec,  # only prctl, before any thread exists
        )
    finally:
        if out is not None:
            out.close()


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream (tests)
        return None


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the child's whole process group (its own children included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop(process: subprocess.Popen[bytes], *, grace: float, sig: int = signal.SIGTERM) -> int:
    """Ask the group to stop with ``sig``; SIGKILL it after ``grace`` seconds. Returns the
    child's exit status."""
    if process.poll() is None:
        signal_group(process, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    if process.poll() is None:
        signal_group(process, signal.SIGKILL)
        process.wait(timeout=10)
    # Whatever the group leader left behind goes too.
    signal_group(process, signal.SIGKILL)
    return process.returncode
