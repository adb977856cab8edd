"""What other parties leave in Redis for a worker's batches, written the way they write it:
another worker's takeover of a job, a stream watching a job it did not start."""

from __future__ import annotations

import redis

from kvrelay.job_lifecycle import WATCH_TTL_S
from kvrelay.job_script_helpers import FENCE_FLAG_TTL_S
from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.job_store import JobStore

KEYS = Keyspace()  # the default namespace


def taken_over(store: JobStore, job_id: str, new_owner: str = "another-worker") -> None:
    """What another worker's claim of ``job_id`` leaves for ``store``'s worker, its old
    owner: the lease and the record name the new owner's run, and the old owner's fence
    flag is up (the claim also moves the old owner's tail events into the log; that part
    is left out here)."""
    run = f"{new_owner}#1"
    store.redis.set(KEYS.lease(job_id), run)
    store.redis.hset(KEYS.job_record(job_id), mapping={"owner": new_owner, "run": run})
    store.redis.set(KEYS.worker_fenced(store.worker_id), "1", ex=FENCE_FLAG_TTL_S)


def watched(client: redis.Redis, job_id: str, token: str = "a-stream") -> None:
    """One stream watching ``job_id``, counted as ``JobLifecycle.watch`` counts it."""
    client.incr(KEYS.watchers(job_id))
    client.expire(KEYS.watchers(job_id), int(WATCH_TTL_S))
    client.sadd(KEYS.watching, token)
    client.expire(KEYS.watching, int(WATCH_TTL_S))
