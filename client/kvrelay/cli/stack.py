"""The local stack behind ``kvrelay up``: a Redis (private, or the one configured) and one
worker process per plan (``--workers``, ``--gpus``), started in that order and stopped in
the reverse one.

``stop()`` is idempotent and is called from a ``finally``: whatever happened (an answer
printed, an error, Ctrl-C, SIGTERM), the workers get SIGTERM (they drain, then exit),
SIGKILL after a grace period, then Redis the same. The children also die with the CLI if
it is killed outright (see ``processes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
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
    def __init__(self, plans: Sequence[WorkerPlan], workdir: Path, *,
                 worker_logs_to_stderr: bool = False):
        self.plans = list(plans)
        self.plan = self.plans[0]  # the model, the Redis limits: the same in every plan
        self.workdir = workdir
        self.worker_logs: list[Path | None] = [
            None if worker_logs_to_stderr else workdir / _log_name(i)
            for i in range(len(self.plans))]
        self.redis: PrivateRedis | None = None
        self.redis_url = ""
        self.workers: list[subprocess.Popen[bytes]] = []
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

    def start_workers(self) -> None:
        for i, plan in enumerate(self.plans):
            env = {**plan.env, "KVRELAY_REDIS_URL": self.redis_url}
            self.plans[i] = dataclasses.replace(plan, env=env)
            self.workers.append(processes.spawn(plan.argv, env=env, log=self.worker_logs[i]))
        self.plan = self.plans[0]

    def start_gateway(self, port: int) -> str:
        """The OpenAI-compatible gateway on ``port`` (``kvrelay gateway``); its URL."""
        argv = [sys.executable, "-m", "kvrelay.cli", "gateway", "--host", "127.0.0.1",
                "--port", str(port), "--redis-url", self.redis_url]
        self.gateway = processes.spawn(argv, log=self.workdir / "gateway.log")
        return f"http://127.0.0.1:{port}/v1"

    def wait_ready(self, client: Client, timeout: float) -> list[WorkerInfo]:
        """Wait for every worker's heartbeat (its model is loaded); fail if one exits."""
        assert self.workers
        many = f"{len(self.workers)} workers" if len(self.workers) > 1 else "the worker"
        spinner = Spinner(f"Loading {self.plan.served_model} in {many}")
        deadline = time.monotonic() + timeout
        host = socket.gethostname()
        pids = [worker.pid for worker in self.workers]
        ready: dict[int, WorkerInfo] = {}
        while True:
            self.check_alive(starting=True)
            with contextlib.suppress(KvrelayError):
                ready = {info.pid: info for info in client.workers()
                         if info.pid in pids and info.host == host}
                if len(ready) == len(pids):
                    infos = [ready[pid] for pid in pids]
                    devices = ", ".join(dict.fromkeys(info.device for info in infos))
                    blocks = infos[0].stats.get("total_blocks", "?")
                    spinner.done(
                        f"{'Worker' if len(pids) == 1 else f'{len(pids)} workers'} ready in "
                        f"{spinner.elapsed:.1f}s: {infos[0].model} on {devices}, {blocks} "
                        f"KV blocks{' each' if len(pids) > 1 else ''}"
                    )
                    return infos
            if time.monotonic() >= deadline:
                self.keep_workdir = True
                late = next(i for i, pid in enumerate(pids) if pid not in ready)
                which = f"worker {late + 1}" if len(pids) > 1 else "the worker"
                raise CliError(
                    f"{which} did not announce itself within {timeout:g}s "
                    f"(KVRELAY_STARTUP_TIMEOUT); {self._log_hint(late)}"
                )
            spinner.tick()
            time.sleep(0.1)

    # ------------------------------------------------------------------ watch

    def check_alive(self, *, starting: bool = False) -> None:
        """Raise ``CliError`` if a worker or the private Redis has exited."""
        for i, worker in enumerate(self.workers):
            if worker.poll() is not None:
                self.keep_workdir = True
                when = "before it was ready" if starting else "unexpectedly"
                which = f"worker {i + 1}" if len(self.workers) > 1 else "the worker"
                raise CliError(f"{which} exited with status {worker.returncode} {when}; "
                               f"{self._log_hint(i)}")
        if self.gateway is not None and self.gateway.poll() is not None:
            self.keep_workdir = True
            raise CliError(f"the gateway exited with status {self.gateway.returncode}; "
                           f"log: {self.workdir / 'gateway.log'}")
        redis = self.redis.process if self.redis is not None else None
        if redis is not None and redis.poll() is not None:
            raise CliError(f"the private Redis exited with status {redis.returncode}")

    def _log_hint(self, i: int) -> str:
        log = self.worker_logs[i]
        if log is None:
            return "its log is above"
        last = _last_meaningful_line(log)
        where = f"full log: {log}"
        return f"last log line: {one_line(last)[:300]}; {where}" if last else where

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Gateway, then workers (so they can finish or hand back their jobs, all at
        once), then Redis."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            processes.stop(gateway, grace=_STOP_MARGIN_S)
        workers, self.workers = self.workers, []
        grace = float(self.plan.env.get("KVRELAY_SHUTDOWN_GRACE") or 30.0)
        for worker in workers:
            if worker.poll() is None:
                processes.signal_group(worker, signal.SIGTERM)
        for worker in workers:
            processes.stop(worker, grace=grace + _STOP_MARGIN_S)
        redis, self.redis = self.redis, None
        if redis is not None:
            redis.stop()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _log_name(i: int) -> str:
    return "worker.log" if i == 0 else f"worker-{i + 1}.log"


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
