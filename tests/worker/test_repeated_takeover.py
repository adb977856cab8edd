"""A job whose owners die one after another is taken over each time without delay.

The job store's requeue marker guards one takeover at a time; once a takeover is
committed it must not outlive it, or the next owner's death waits for the marker to
expire (CI saw a second takeover take 10.6 s instead of one lease period).
"""

from __future__ import annotations

import pytest
import redis

from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()


def _store(client: redis.Redis, url: str, worker_id: str) -> JobStore:
    return JobStore(client, WorkerSettings(redis_url=url, model_name="m", worker_id=worker_id,
                                           max_attempts=5))


def test_a_second_owner_death_is_taken_over_at_once(clean_redis_url: str) -> None:
    client = redis.Redis.from_url(clean_redis_url)
    try:
        first, second, watcher = (_store(client, clean_redis_url, w) for w in ("a", "b", "c"))
        assert first.claim("j", '{"prompt": "x"}', "d").status == "claimed"
        client.delete(KEYS.lease("j"))  # owner a died
        status, payload, _ = watcher.check_expired("j")
        assert (status, payload) == ("requeue", '{"prompt": "x"}')
        watcher.commit_requeue("j")
        assert client.exists(KEYS.requeue_marker("j")) == 0
        assert second.claim("j", '{"prompt": "x"}', "d").status == "claimed"
        client.delete(KEYS.lease("j"))  # owner b died too, right away
        assert watcher.check_expired("j")[0] == "requeue"
    finally:
        client.close()


def test_two_watchers_never_requeue_the_same_death_twice(clean_redis_url: str) -> None:
    client = redis.Redis.from_url(clean_redis_url)
    try:
        owner, one, other = (_store(client, clean_redis_url, w) for w in ("a", "b", "c"))
        assert owner.claim("j", '{"prompt": "x"}', "d").status == "claimed"
        client.delete(KEYS.lease("j"))
        assert one.check_expired("j")[0] == "requeue"
        assert other.check_expired("j")[0] == "busy"  # mid-takeover: the marker holds
        one.commit_requeue("j")
        # Queued again, not running: not due before a lease has passed, and then looked
        # at as a queued job whose copy may be lost, never as a second death.
        assert "j" not in other.expired_candidates()
        assert other.check_expired("j")[0] == "queued"
    finally:
        client.close()
