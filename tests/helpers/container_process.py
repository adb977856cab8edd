"""Run a rendered container (its command and environment, as the chart declares them) as
a local process: what the kubelet would start, minus the image.

The image's executables are this virtualenv's (``kvrelay`` resolves to .venv/bin/kvrelay);
the environment is the test runner's (HOME, thread counts, compiled-kernel caches) less
any ``KVRELAY_*`` of its own, plus the container's; container paths that do not exist
here are moved under a private root folder, as the image's filesystem would hold them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def local_env(container_env: dict[str, str], root: Path) -> dict[str, str]:
    """The process environment for ``container_env`` (see the module's docstring)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KVRELAY_") or k.startswith("KVRELAY_TEST_")}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for name, value in container_env.items():
        if value.startswith("/") and not Path(value).exists():
            value = str(root / value.lstrip("/"))
        env[name] = value
    return env


def with_mounts(command: list[str], mounts: dict[str, Path]) -> list[str]:
    """``command`` with each mount path (a container folder) replaced by the local folder
    standing in for its volume, wherever a path starts with it (shell scripts included)."""
    # One pass over every mount path (longest first), so a replacement is never replaced.
    paths = "|".join(re.escape(path) for path in sorted(mounts, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w/])({paths})(?=/|\s|$)")
    return [pattern.sub(lambda m: str(mounts[m.group(1)]), arg) for arg in command]


class ContainerProcess:
    """One container's command in its own process group, its output in a log file."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path) -> None:
        executable = shutil.which(command[0], path=env["PATH"])
        if executable is None:
            raise FileNotFoundError(f"{command[0]} is not on this virtualenv's PATH")
        self.argv = [executable, *command[1:]]
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ContainerProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """SIGTERM, as the kubelet sends it when a pod stops."""
        if self.alive():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
