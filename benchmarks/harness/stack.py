"""The one way a benchmark starts a private Redis and a worker stack.

Redis is always the SDK's own ``PrivateRedis`` (what ``kvrelay up`` runs); a worker stack
is ``kvrelay up``'s ``LocalStack``: the same launch plan, process groups and shutdown a
user gets, so a benchmark measures what users run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.tiny_model import make_tiny_model


def pin_process(pid: int, cpus: set[int] | None) -> None:
    """Confine every thread of process ``pid`` to ``cpus`` (None: leave it be)."""
    if not cpus:
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def private_redis(workdir: Path, cpus: set[int] | None = None,
                  extra_args: tuple[str, ...] = ()) -> Iterator[Any]:
    """A started ``PrivateRedis`` (``.url``, ``.port``, ``.process``) on ``cpus``,
    stopped on exit."""
    from kvrelay.cli.redis_server import PrivateRedis

    server = PrivateRedis(workdir, extra_args=extra_args).start()
    try:
        assert server.process is not None
        pin_process(server.process.pid, cpus)
        yield server
    finally:
        server.stop()


@dataclass
class WorkerStack:
    """A running stack: its Redis URL, the served model's name and the ready worker."""

    stack: Any  # kvrelay.cli.stack.LocalStack
    info: Any  # the worker's first heartbeat (kvrelay.protocol.WorkerInfo)

    @property
    def url(self) -> str:
        return str(self.stack.redis_url)

    @property
    def served_model(self) -> str:
        return str(self.stack.plan.served_model)

    @property
    def worker_log(self) -> Path | None:
        """The worker's log file (None: its output went to stderr)."""
        log: Path | None = self.stack.worker_logs[0]
        return log

    def start_gateway(self, port: int) -> str:
        """The OpenAI-compatible gateway on ``port`` beside the worker; its URL."""
        return str(self.stack.start_gateway(port))

    @property
    def gateway_pid(self) -> int:
        assert self.stack.gateway is not None
        return int(self.stack.gateway.pid)


@contextlib.contextmanager
def worker_stack(settings: Mapping[str, Any], workdir: Path, redis_url: str | None = None,
                 env: Mapping[str, str] | None = None, ready_timeout: float = 300
                 ) -> Iterator[WorkerStack]:
    """One worker with ``settings`` (``kvrelay worker``'s names: model, device, ...),
    ready to serve, on ``redis_url`` or on a private Redis; everything stopped on exit."""
    from kvrelay import Client
    from kvrelay.cli.stack import LocalStack
    from kvrelay.cli.worker_launch import plan_worker, worker_environment

    plan = plan_worker(worker_environment(dict(env or os.environ), dict(settings)),
                       loglevel="WARNING")
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack([plan], workdir)
    try:
        stack.start_redis(redis_url)
        stack.start_workers()
        with Client(stack.redis_url, model=stack.plan.served_model) as client:
            (info,) = stack.wait_ready(client, timeout=ready_timeout)
        yield WorkerStack(stack, info)
    finally:
        stack.stop()


@contextlib.contextmanager
def tiny_worker_stack(redis_url: str | None, concurrency: int, workdir: Path
                      ) -> Iterator[WorkerStack]:
    """A worker serving the tiny random model (torch on one thread), for benchmarks that
    measure everything but the model; the model is built in a child process so torch
    stays out of the caller's heap."""
    folder = workdir / "tiny-llama"
    builder = multiprocessing.get_context("spawn").Process(target=make_tiny_model,
                                                           args=(folder,))
    builder.start()
    builder.join()
    settings = {"model": str(folder), "device": "cpu", "concurrency": concurrency,
                "max_num_seqs": 256, "redis_url": redis_url}
    with worker_stack(settings, workdir / "stack", redis_url,
                      env={**os.environ, "OMP_NUM_THREADS": "1"}, ready_timeout=120) as stack:
        yield stack
