"""Lease upkeep against a real Redis: every held job in one script call, what was lost or
aborted reported, and per job only the write that cannot be shared (its lease's PEXPIRE)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    yield JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                          lease_ttl=20))
    client.close()


def _calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


def test_one_call_extends_the_held_leases_and_reports_the_lost_and_the_aborted(
        store: JobStore) -> None:
    held, taken, aborted = "held", "taken", "aborted"
    for job_id in (held, aborted):
        store.redis.set(KEYS.lease(job_id), store.worker_id, px=1000)
    store.redis.set(KEYS.lease(taken), "another-worker", px=1000)
    store.redis.set(KEYS.abort_flag(aborted), b"1")
    store.refresh_leases(["warm-up"])  # loads the script
    before = _calls(store.redis)

    assert store.refresh_leases([held, taken, aborted]) == ([taken], [aborted])

    after = _calls(store.redis)
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    # One TIME: expiries are judged on Redis's clock, never the worker's.
    assert {k: v for k, v in delta.items() if v and k != "info"} == {
        "fcall": 1, "mget": 1, "pexpire": 2, "zadd": 1, "time": 1}
    for job_id in (held, aborted):
        assert 19_000 < store.redis.pttl(KEYS.lease(job_id)) <= 20_000
    assert store.redis.pttl(KEYS.lease(taken)) <= 1000
    scores = dict(store.redis.zrange(store.running_key, 0, -1, withscores=True))
    assert set(scores) == {held.encode(), aborted.encode()}
    assert store.refresh_leases([]) == ([], [])
