"""Real gateway processes (``kvrelay gateway``) for tests: started, waited for, stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class GatewayProcess:
    """``kvrelay gateway --port P`` in its own process group, output in a log file."""

    def __init__(self, redis_url: str, log_dir: Path, name: str = "gateway",
                 *extra_args: str, **env: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.args = [sys.executable, "-m", "kvrelay.cli", "gateway", "--port", str(self.port),
                     "--redis-url", redis_url, *extra_args]
        self.env = {**os.environ, **{k: str(v) for k, v in env.items()}}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.args, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.tail()}")
            try:
                httpx.get(f"{self.url}/metrics", timeout=1.0)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"gateway not up after {timeout}s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
