"""Behind sentinels every job-state write of the worker waits for a replica (``WAIT``),
so a failover cannot lose it: terminal events, unclaimed failures, hand-backs, the
failover's requeue decision and its commit.

Real processes (a primary, its replica, three sentinels) and the worker's own job store
over the ``redis+sentinel://`` URL; each write is counted by the primary's own
``WAIT`` statistics. (Before, only the publisher's batches, claims, releases and lease
refreshes waited: the others could be lost with a primary that died right after them.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from helpers.sentinel_cluster import SentinelCluster

from kvrelay.keys import Keyspace
from kvrelay.protocol import Failed
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.redis_client import worker_redis
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration
KEYS = Keyspace()


@pytest.fixture(scope="module")
def cluster(module_sentinels: SentinelCluster) -> SentinelCluster:
    return module_sentinels


@pytest.fixture(scope="module")
def store(cluster: SentinelCluster) -> Iterator[JobStore]:
    # A generous WAIT timeout: one short answer (a replica slow to acknowledge on a busy
    # machine) turns waiting off for a few seconds, and the next writes would send none.
    settings = WorkerSettings(redis_url=f"{cluster.url}?wait_timeout_ms=10000",
                              model_name="m", worker_id="w1")
    client = worker_redis(settings)
    yield JobStore(client, settings)
    client.close()


def _waits(cluster: SentinelCluster) -> int:
    with redis.Redis(host="127.0.0.1", port=cluster.primary_port()) as primary:
        return int(primary.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def _claimed(store: JobStore, job_id: str) -> None:
    assert store.claim(job_id, "{}", "d", f"w1#{job_id}").status == "claimed"


def _nothing(store: JobStore) -> None:
    pass


def _expired(store: JobStore) -> None:
    _claimed(store, "expired")
    store.redis.delete(KEYS.lease("expired"))


# Per write: what comes before it (not counted), then the write.
WRITES: dict[str, tuple[Callable[[JobStore], object], Callable[[JobStore], object]]] = {
    "the failure of a job never claimed": (_nothing, lambda s: s.fail_unclaimed(
        "never-claimed", "invalid_request", "bad")),
    "a claimed job's failure": (lambda s: _claimed(s, "failed"), lambda s: s.append_event(
        "failed", Failed(seq=0, code="internal", message="x"), fenced="w1#failed")),
    "a hand-back's mark": (lambda s: _claimed(s, "handed"),
                           lambda s: s.mark_handback("handed", "w1#handed")),
    "a hand-back's release": (lambda s: s.mark_handback("handed", "w1#handed"),
                              lambda s: s.release_handback("handed", "w1#handed")),
    "the failover's check of an expired lease": (_expired,
                                                 lambda s: s.check_expired("expired")),
    "the failover's requeue": (_nothing, lambda s: s.commit_requeue("expired")),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_each_state_write_waits_for_a_replica(cluster: SentinelCluster, store: JobStore,
                                              write: str) -> None:
    setup, act = WRITES[write]
    setup(store)
    before = _waits(cluster)
    act(store)
    assert _waits(cluster) > before, f"{write} did not wait for a replica"
