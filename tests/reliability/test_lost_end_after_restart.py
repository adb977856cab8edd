"""A job whose end Redis lost in a restart does not run again.

Chaos seed 10012: Redis restarted from an AOF fsynced once a second lost, among the last
writes it had acknowledged, the release that marked a finished job done; the dead-delivery
watch then gave the job's message back and the job ran a second time, its caller long
done. Real Redis, a real worker: a snapshot is taken while the job runs, the job
finishes, and Redis restarts from the snapshot (what it acknowledged since is lost, as a
crash between two fsyncs loses it). The record reads ``running`` again with a lease
about to lapse. Before: the watch took the job over and a second run wrote to its log.
Now: the worker that ended it writes its end again once its writes get through, before any
watch looks (``kvrelay_worker.jobs.recent_endings``); nothing more is written to the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from helpers.redis_server import RedisServer
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.event_log import entry_run
from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "simulated"
SETTINGS = {"concurrency": 4, "simulated_step_ms": 20, "lease_ttl": 2.0, "lease_refresh": 0.5,
            "watchdog_interval": 0.5}
# Past a lease, a heartbeat's TTL and two watch periods, with room for two shared cores:
# when a takeover of the job would have happened.
WATCHED_FOR_S = 8.0


def test_a_job_whose_end_a_restart_lost_does_not_run_again(
        redis_server_factory: Callable[[], RedisServer], tmp_path: Path) -> None:
    server = redis_server_factory()
    worker = WorkerProcess("ender", server.url, MODEL, tmp_path, **SETTINGS)
    worker.start()
    try:
        worker.wait_ready()
        with Client(server.url, model=MODEL, stream_timeout=20) as client:
            with client.stream(prompt="a job whose end is lost", max_tokens=80,
                               ignore_eos=True) as stream:
                for count, _chunk in enumerate(stream):
                    if count == 5:
                        with redis.Redis.from_url(server.url) as direct:
                            direct.save()  # what the restart will come back with
                final = stream.final()
                job = stream.job_id
        assert len(final.token_ids) == 80
        server.stop()
        server.start()
        with redis.Redis.from_url(server.url) as direct:
            assert direct.hget(KEYS.job_record(job), "state") == b"running"  # the end is lost
            writers_before = {entry_run(f) for _, f in direct.xrange(KEYS.event_log(job))}
            time.sleep(WATCHED_FOR_S)
            writers_after = {entry_run(f) for _, f in direct.xrange(KEYS.event_log(job))}
            assert writers_after == writers_before, "a second run wrote to the job's log"
            assert direct.hget(KEYS.job_record(job), "state") == b"done"
            assert direct.zscore(KEYS.running_jobs(MODEL), job) is None
        assert "Redis had lost its end" in worker.tail(None)
        assert worker.alive()
    finally:
        worker.stop()


def test_an_end_written_again_never_brings_back_an_expired_record(
        clean_redis_url: str) -> None:
    direct = redis.Redis.from_url(clean_redis_url)
    store = JobStore(direct, WorkerSettings(redis_url=clean_redis_url, model_name="m"))
    store.scripts.load()
    assert store.reassert_end("expired", "run-1") == 0  # gone as an ended job's record goes
    assert not direct.exists(KEYS.job_record("expired"))
    assert store.reassert_end("lost", "run-1", lost=True) == 1  # still to live: lost
    assert direct.hgetall(KEYS.job_record("lost")) == {b"state": b"done"}
    direct.hset(KEYS.job_record("lost-end"), mapping={"state": "running", "run": "run-1",
                                                      "payload": "{}"})
    direct.set(KEYS.lease("other"), "run-2")
    direct.hset(KEYS.job_record("other"), mapping={"state": "running", "run": "run-2"})
    assert store.reassert_end("lost-end", "run-1") == 1
    assert direct.hgetall(KEYS.job_record("lost-end")) == {b"state": b"done"}
    assert 0 < direct.ttl(KEYS.job_record("lost-end")) <= store.ended_ttl_s
    assert store.reassert_end("lost-end", "run-1") == 0  # already done
    assert store.reassert_end("other", "run-1") == -1  # another run holds it: too late
    assert direct.hget(KEYS.job_record("other"), "state") == b"running"
