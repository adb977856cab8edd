"""A worker started while its Redis is out of reach (not up yet, or failing over with no
primary) waits for it, as Celery waits for its broker, and then serves; it does not exit.

Before, the worker's start asked Redis for its version (to load kvrelay's functions) and
a connection error there stopped Celery with "Unrecoverable error" (chaos seed 105,
sentinel: a worker restarted during a failover exited with ``MasterNotFoundError``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.redis_server import RedisServer, free_port
from helpers.worker_process import WorkerProcess

from kvrelay import Client

pytestmark = pytest.mark.integration

JOB = {"prompt": "a question the simulated engine answers", "max_tokens": 12}


def test_a_worker_started_before_its_redis_waits_and_serves(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    worker = WorkerProcess("early", url, "simulated", tmp_path, concurrency=2,
                           simulated_step_ms=5).start()
    server = RedisServer(tmp_path / "redis", port=port)
    try:
        time.sleep(6)  # the worker has reached its start and found no Redis
        assert worker.alive(), worker.tail()
        server.start()
        worker.wait_ready(timeout=90)
        with Client(url, model="simulated", stream_timeout=30) as client:
            result = client.generate(**JOB)
        assert len(result.token_ids) == 12
        assert worker.alive()
    finally:
        worker.stop()
        server.stop()
