"""The local stack behind ``kvrelay up``: a Redis (private, or the one configured) and one
worker process, started in that order and stopped in the reverse one.

``stop()`` is idempotent and is called from a ``finally``: whatever happened (an answer
printed, an error, Ctrl-C, SIGTERM), the worker gets SIGTERM (it drains, then exits),
SIGKILL after a grace period, then Redis the same. The children also die with the CLI if
it is killed outright (see ``processes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from kvrelay import Client, KvrelayError, WorkerInfo
from kvrelay.cli import processes
from kvrelay.cli.errors import CliError, one_line
from kvrelay.cli.progress import Spinner
from kvrelay.cli.redis_server import PrivateRedis, ping
from kvrelay.cli.worker_launch import WorkerPlan
from kvrelay.protocol import DEFAULT_MAX_PAYLOAD_BYTES

# Extra seconds the worker gets, beyond its drain grace, before it is killed.
_STOP_MARGIN_S = 10.0


class LocalStack:
    def __init__(self, plan: WorkerPlan, workdir: Path, *, worker_logs_to_stderr: bool = False):
        self.plan = plan
        self.workdir = workdir
        self.worker_log: Path | None = None if worker_logs_to_stderr else workdir / "worker.log"
        self.redis: PrivateRedis | None = None
        self.redis_url = ""
        self.worker: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self.keep_workdir = False

    # ------------------------------------------------------------------ start

    def start_redis(self, external_url: str | None, port: int = 0) -> str:
        """Use ``external_url`` (checked to answer), else start a private server."""
        if external_url:
            ping(external_url)
            self.redis_url = external_url
        else:
            payload = self.plan.env.get("KVRELAY_MAX_PAYLOAD_BYTES")
            self.redis = PrivateRedis(
                self.workdir / "redis",
                port,
                max_payload_bytes=int(payload) if payload else DEFAULT_MAX_PAYLOAD_BYTES,
            )
            self.redis.start()
            self.redis_url = self.redis.url
        return self.redis_url

    def start_worker(self) -> None:
        env = {**self.plan.env, "KVRELAY_REDIS_URL": self.redis_url}
        self.plan = dataclasses.replace(self.plan, env=env)
        self.worker = processes.spawn(self.plan.argv, env=env, log=self.worker_log)

    def start_gateway(self, port: int) -> str:
        """The OpenAI-compatible gateway on ``port`` (``kvrelay gateway``); its URL."""
        argv = [sys.executable, "-m", "kvrelay.cli", "gateway", "--host", "127.0.0.1",
                "--port", str(port), "--redis-url", self.redis_url]
        self.gateway = processes.spawn(argv, log=self.workdir / "gateway.log")
        return f"http://127.0.0.1:{port}/v1"

    def wait_ready(self, client: Client, timeout: float) -> WorkerInfo:
        """Wait for this worker's heartbeat (the model is loaded); fail if it exits."""
        assert self.worker is not None
        spinner = Spinner(f"Loading {self.plan.served_model} in the worker")
        deadline = time.monotonic() + timeout
        host = socket.gethostname()
        while True:
            self.check_alive(starting=True)
            with contextlib.suppress(KvrelayError):
                for info in client.workers():
                    if info.pid == self.worker.pid and info.host == host:
                        stats = info.stats
                        spinner.done(
                            f"Worker ready in {spinner.elapsed:.1f}s: {info.model} on "
                            f"{info.device}, {stats.get('total_blocks', '?')} KV blocks"
                        )
                        return info
            if time.monotonic() >= deadline:
                self.keep_workdir = True
                raise CliError(
                    f"the worker did not announce itself within {timeout:g}s "
                    f"(KVRELAY_STARTUP_TIMEOUT); {self._log_hint()}"
                )
            spinner.tick()
            time.sleep(0.1)

    # ------------------------------------------------------------------ watch

    def check_alive(self, *, starting: bool = False) -> None:
        """Raise ``CliError`` if the worker or the private Redis has exited."""
        if self.worker is not None and self.worker.poll() is not None:
            self.keep_workdir = True
            when = "before it was ready" if starting else "unexpectedly"
            raise CliError(
                f"the worker exited with status {self.worker.returncode} {when}; {self._log_hint()}"
            )
        if self.gateway is not None and self.gateway.poll() is not None:
            self.keep_workdir = True
            raise CliError(f"the gateway exited with status {self.gateway.returncode}; "
                           f"log: {self.workdir / 'gateway.log'}")
        redis = self.redis.process if self.redis is not None else None
        if redis is not None and redis.poll() is not None:
            raise CliError(f"the private Redis exited with status {redis.returncode}")

    def _log_hint(self) -> str:
        if self.worker_log is None:
            return "its log is above"
        last = _last_meaningful_line(self.worker_log)
        where = f"full log: {self.worker_log}"
        return f"last log line: {one_line(last)[:300]}; {where}" if last else where

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Gateway, then worker (so it can finish or hand back its jobs), then Redis."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            processes.stop(gateway, grace=_STOP_MARGIN_S)
        worker, self.worker = self.worker, None
        if worker is not None:
            grace = float(self.plan.env.get("KVRELAY_SHUTDOWN_GRACE") or 30.0)
            processes.stop(worker, grace=grace + _STOP_MARGIN_S)
        redis, self.redis = self.redis, None
        if redis is not None:
            redis.stop()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _last_meaningful_line(log: Path) -> str:
    """The last line that looks like an error, else the last non-empty one."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    for line in reversed(lines[-50:]):
        if "Error" in line or "error" in line:
            return line
    return lines[-1] if lines else ""
