"""A real Redis that can fail over: a primary, a replica and three sentinels on free ports.

Each is its own ``redis-server`` process (the sentinels run with ``--sentinel`` from a
config file they may rewrite, as sentinels do). ``kill_primary`` is SIGKILL: no shutdown,
no last replication, as when the machine dies.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis

from kvrelay.cli.redis_server import PrivateRedis, find_redis_server, free_port

MASTER_NAME = "kvrelay-ha"


class SentinelCluster:
    def __init__(self, workdir: Path, *, down_after_ms: int = 1000) -> None:
        self.workdir = workdir
        self.down_after_ms = down_after_ms
        self.primary = PrivateRedis(workdir / "primary")
        self.replica = PrivateRedis(workdir / "replica")
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self, timeout: float = 30.0) -> SentinelCluster:
        """Start everything and wait until a failover could happen; on any failure, stop
        what was started (the sentinels run in sessions of their own)."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self.primary.start()
        self.replica.extra_args = ("--replicaof", "127.0.0.1", str(self.primary.port))
        self.replica.start()
        binary = find_redis_server()
        for index, port in enumerate(self.sentinel_ports):
            folder = self.workdir / f"sentinel{index}"
            folder.mkdir(parents=True)
            conf = folder / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"logfile {folder / 'sentinel.log'}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n")
            self.sentinels.append(subprocess.Popen(
                [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True))
        self._wait_settled(timeout)

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index],
                           socket_connect_timeout=1, socket_timeout=5)

    def primary_port(self) -> int:
        """The primary's port as the first sentinel sees it now."""
        with self.sentinel_client() as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                             MASTER_NAME)
        return int(port)

    def wait_replaced(self, old: int, timeout: float = 30.0) -> int:
        """Until the sentinels name a primary other than the one at port ``old`` (a
        failover the test set off); its port."""
        deadline = time.monotonic() + timeout
        while (port := self.primary_port()) == old:
            assert time.monotonic() < deadline, "the sentinels never failed over"
            time.sleep(0.1)
        return port

    def _wait_settled(self, timeout: float) -> None:
        """Until the replica is in sync and every sentinel knows the replica and the two
        other sentinels (a failover needs a quorum and an elected leader)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._settled():
                return
            time.sleep(0.2)
        raise TimeoutError("the sentinels never saw the replica and each other")

    def _settled(self) -> bool:
        with redis.Redis(host="127.0.0.1", port=self.replica.port) as replica:
            if replica.info("replication").get("master_link_status") != "up":
                return False
        for index in range(len(self.sentinel_ports)):
            try:
                with self.sentinel_client(index) as client:
                    master = client.sentinel_master(MASTER_NAME)
            except redis.ConnectionError:
                return False
            if int(master["num-slaves"]) < 1 or int(master["num-other-sentinels"]) < 2:
                return False
        return True

    def kill_primary(self) -> None:
        process = self.primary.process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.sentinels:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
        self.sentinels.clear()
        self.replica.stop()
        self.primary.stop()
