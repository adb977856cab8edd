"""A worker behind sentinels keeps kvrelay's broker transport after kombu moved on to
another sentinel's URL.

When a consumer connection attempt fails (no sentinel names a primary during a
failover, or none is reachable), kombu switches to the next ``sentinel://`` URL, and the
switch takes the transport from the URL's scheme, not from the app's
``broker_transport``. The consumer then ran on kombu's own Sentinel transport for the
rest of the worker's life: no record naming the worker beside each delivery (the
dead-delivery watch cannot give back what it took), no leaving a replaced primary, and a
close after a reconnect raised ``AttributeError``, which stopped the worker (chaos seed
233, a worker cut off from Redis and its sentinels). Real sentinels and Redis, a real
worker cut off through the chaos proxy until kombu has switched URLs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from chaos.proxy import ProxyHub, sentinel_group
from helpers.sentinel_cluster import MASTER_NAME, SentinelCluster
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
SWITCHED = "Cannot connect to sentinel://"


def _wait_for_log(worker: WorkerProcess, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.tail(None):
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log:\n{worker.tail()}"
        time.sleep(0.1)


def test_deliveries_are_recorded_after_kombu_switched_sentinel_urls(tmp_path: Path) -> None:
    cluster = SentinelCluster(tmp_path / "ha").start()
    hub = ProxyHub()
    worker = WorkerProcess("switched", cluster.url, MODEL, tmp_path, concurrency=4,
                           simulated_step_ms=20, lease_ttl=2.0, lease_refresh=0.5,
                           watchdog_interval=0.5)
    try:
        group, worker_url = sentinel_group(hub, "worker",
                                           [cluster.primary.port, cluster.replica.port],
                                           cluster.sentinel_ports, MASTER_NAME)
        worker.env["KVRELAY_REDIS_URL"] = worker_url
        worker.start().wait_ready()
        info = worker.info()
        assert info is not None
        group.cut()  # no sentinel reachable: kombu tries the next URLs
        _wait_for_log(worker, SWITCHED, 30)
        group.heal_cut()
        _wait_for_log(worker, "Connected to sentinel://", 30)
        direct = redis.Redis(host="127.0.0.1", port=cluster.primary_port())
        owners: set[bytes] = set()
        with Client(cluster.url, model=MODEL, stream_timeout=30) as client:
            with client.stream(prompt="taken after the switch", max_tokens=150) as stream:
                for _chunk in stream:
                    owners |= set(direct.hvals(KEYS.celery_delivered))
                final = stream.final()
        direct.close()
        assert final.finish_reason == "length"
        assert info["worker_id"].encode() in owners, (
            f"no delivery recorded for {info['worker_id']} (records: {owners}); "
            f"log:\n{worker.tail(6000)}")
        assert worker.alive()
    finally:
        worker.stop()
        hub.close()
        cluster.stop()
