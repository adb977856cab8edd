"""A real Redis that refuses writes on demand, the ways production Redis does.

``ReplicatedPrimary`` is a primary with one replica under ``min-replicas-to-write 1``
(``min-replicas-max-lag 1``): stopping the replica (SIGSTOP, as a partition or a stalled
host looks from the primary) makes every write answer ``NOREPLICAS`` about a second later,
until the replica runs again. ``misconf`` makes the primary's snapshots fail (a folder it
cannot write), so writes answer ``MISCONF``; ``pause_writes`` is ``CLIENT PAUSE WRITE``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from kvrelay.cli.redis_server import PrivateRedis


class ReplicatedPrimary:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = PrivateRedis(workdir / "primary", extra_args=(
            "--min-replicas-to-write", "1", "--min-replicas-max-lag", "1",
            "--enable-protected-configs", "yes", "--databases", "64"))
        self.replica = PrivateRedis(workdir / "replica")
        self._replica_stopped = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.primary.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.primary.port, socket_timeout=5)

    def start(self, timeout: float = 20.0) -> ReplicatedPrimary:
        self.primary.start()
        self.replica.extra_args = ("--replicaof", "127.0.0.1", str(self.primary.port),
                                   "--databases", "64")
        self.replica.start()
        self.wait_writable(timeout)
        return self

    def wait_writable(self, timeout: float = 20.0) -> None:
        """Until the primary takes a write (its replica is in sync and acknowledging)."""
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                try:
                    client.set("kvrelay-test:writable", "1")
                    return
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def refusing(self) -> bool:
        with self.client() as client:
            try:
                client.set("kvrelay-test:writable", "1")
            except redis.ResponseError as exc:
                return "NOREPLICAS" in str(exc) or "MISCONF" in str(exc)
        return False

    def stop_replica(self, timeout: float = 10.0) -> None:
        """SIGSTOP the replica and wait until the primary refuses writes."""
        process = self.replica.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        self._replica_stopped = True
        deadline = time.monotonic() + timeout
        while not self.refusing():
            assert time.monotonic() < deadline, "the primary never refused a write"
            time.sleep(0.05)

    def resume_replica(self) -> None:
        process = self.replica.process
        assert process is not None
        os.kill(process.pid, signal.SIGCONT)
        self._replica_stopped = False

    def misconf(self) -> None:
        """Make the primary's snapshots fail, so it refuses writes with ``MISCONF``: its
        folder is removed under it (as root, a mode bit would stop nothing)."""
        doomed = self.workdir / "doomed"
        doomed.mkdir(exist_ok=True)
        with self.client() as client:
            client.config_set("save", "3600 1")  # only a server that snapshots refuses
            client.config_set("dir", str(doomed))
            doomed.rmdir()
            try:
                client.bgsave()
            except redis.ResponseError:
                pass
            deadline = time.monotonic() + 10
            while client.info("persistence").get("rdb_last_bgsave_status") != "err":
                assert time.monotonic() < deadline, "the snapshot never failed"
                time.sleep(0.05)

    def heal_misconf(self) -> None:
        with self.client() as client:
            client.config_set("dir", str(self.workdir / "primary"))
            client.bgsave()
            deadline = time.monotonic() + 10
            while client.info("persistence").get("rdb_last_bgsave_status") != "ok":
                assert time.monotonic() < deadline, "the snapshot never recovered"
                time.sleep(0.05)

    def stop(self) -> None:
        if self._replica_stopped:
            self.resume_replica()
        self.replica.stop()
        self.primary.stop()
