"""Real Celery worker processes for integration tests, started and killed like in production.

Each worker is ``celery -A kvrelay_worker.app worker`` in its own process group, configured
through ``KVRELAY_*`` variables, with its output in a log file the test can show on
failure. ``wait_ready`` waits for the worker's heartbeat in Redis (the engine is loaded
and the worker is consuming).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from kvrelay.cli.redis_server import sync_redis_for
from kvrelay.keys import Keyspace
from kvrelay.protocol import decode_worker_info


def redis_for(url: str) -> redis.Redis:
    """A client for ``url``; for a Sentinel URL, for the primary the sentinels name now."""
    return sync_redis_for(url, timeout=5.0)


class WorkerProcess:
    def __init__(self, name: str, redis_url: str, model: str, log_dir: Path,
                 concurrency: int = 8, **settings: Any) -> None:
        self.name = name
        self.redis_url = redis_url
        self.model = model
        self.concurrency = concurrency
        self.log_path = log_dir / f"{name}.log"
        env = dict(os.environ)
        env.update({
            "KVRELAY_REDIS_URL": redis_url,
            "KVRELAY_MODEL": model,
            "KVRELAY_DEVICE": "cpu",
            "KVRELAY_CONCURRENCY": str(concurrency),
            "PYTHONUNBUFFERED": "1",
        })
        for key, value in settings.items():
            env[f"KVRELAY_{key.upper()}"] = str(value)
        self.env = env
        self.keys = Keyspace(env.get("KVRELAY_NAMESPACE", ""))
        self.process: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> WorkerProcess:
        from kvrelay_worker.settings import WorkerSettings

        settings = WorkerSettings.from_env({k: v for k, v in self.env.items()
                                            if k.startswith("KVRELAY_")})
        queue = settings.keys.celery_queue(settings.served_model)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "kvrelay_worker.app", "worker",
             "--pool", "threads", "--concurrency", str(self.concurrency), "--queues", queue,
             "--hostname", f"{self.name}@%h", "--loglevel", "INFO", "--without-mingle",
             "--without-gossip"],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    def info(self) -> dict[str, Any] | None:
        """This worker's latest heartbeat (``WorkerInfo`` as a dict), or None."""
        client = redis_for(self.redis_url)
        try:
            for worker_id in client.smembers(self.keys.workers):
                raw = client.get(self.keys.worker_heartbeat(worker_id.decode()))
                if raw is None:
                    continue
                info = decode_worker_info(raw)
                if info.pid == self.pid:
                    return {"worker_id": info.worker_id, "stats": info.stats, "pid": info.pid,
                            "jobs_running": info.jobs_running, "draining": info.draining,
                            "updated_at": info.updated_at}
        finally:
            client.close()
        return None

    def stats(self) -> dict[str, Any]:
        info = self.info()
        return info["stats"] if info else {}

    def wait_for_stats(self, predicate: Callable[[dict[str, Any]], bool],
                       timeout: float = 15.0) -> dict[str, Any]:
        """Poll the heartbeat (refreshed every second) until ``predicate(stats)`` holds.

        Only a heartbeat written after this call counts: one from before the work the caller
        just did (the worker may finish a burst of jobs between two heartbeats) still shows
        the state before it, which would let "all blocks free" hold vacuously.
        """
        called_at = time.time()
        deadline = time.monotonic() + timeout
        stats: dict[str, Any] = {}
        while time.monotonic() < deadline:
            info = self.info()
            if info is not None and info["updated_at"] >= called_at:
                stats = info["stats"]
                if predicate(stats):
                    return stats
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} stats never matched; last: {stats}; "
                           f"alive: {self.alive()}; log:\n{self.tail()}")

    def wait_ready(self, timeout: float = 120.0) -> WorkerProcess:
        """Wait for the heartbeat and for Celery's own ready line: the engine is loaded
        and the consumer has declared its queues (the kvrelay ready line comes before
        that, so Redis may still gain the consumer's keys after it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited early:\n{self.tail()}")
            # The whole log: a worker started beside a queue of jobs logs a line per job
            # from its first second, and its ready lines soon leave any fixed tail.
            log = self.tail(None)
            if self.info() is not None and "kvrelay worker" in log and \
                    f"{self.name}@" in log and " ready." in log:
                return self
            time.sleep(0.2)
        raise TimeoutError(f"worker {self.name} not ready after {timeout}s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, as when a machine dies."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.wait_exit(20)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, chars: int | None = 3000) -> str:
        """The log's last ``chars`` characters (None: all of it)."""
        try:
            text = self.log_path.read_text(errors="replace")
            return text if chars is None else text[-chars:]
        except FileNotFoundError:
            return ""
