"""A dead worker's own queue is emptied onto the shared queue; a live one's is left alone.

Real Redis, no Celery: the lists are filled as kombu fills them (LPUSH at the back, one
list per priority step), and the recent-prefix set a worker advertises is checked
against its bounds.
"""

from __future__ import annotations

import redis
from kombu.transport.redis import Channel

from kvrelay.prefix_filter import MAX_ADVERTISED, PrefixFilter
from kvrelay.prefix_fingerprints import CHUNK_TOKENS, request_fingerprints
from kvrelay.protocol import GenerateRequest
from kvrelay_worker.jobs.orphan_queues import OrphanQueues
from kvrelay_worker.recent_prefixes import RecentPrefixes, prefix_capacity
from kvrelay_worker.settings import WorkerSettings

MODEL = "m"


def _settings(url: str, worker_id: str) -> WorkerSettings:
    return WorkerSettings(redis_url=url, model=MODEL, worker_id=worker_id)


def test_dead_workers_jobs_move_to_the_shared_queue_front_in_order(clean_redis_url: str) -> None:
    client = redis.Redis.from_url(clean_redis_url)
    me = _settings(clean_redis_url, "live:1:a")
    keys = me.keys
    dead, alive = "gone:2:b", "busy:3:c"
    for worker in (dead, alive):
        client.zadd(keys.worker_queues(MODEL), {worker: 1})  # long-ago heartbeats
        for n in range(3):  # kombu LPUSHes: the oldest ends up at the right, popped first
            client.lpush(keys.worker_queue(MODEL, worker), f"{worker}-{n}")
    urgent = keys.worker_queue(MODEL, dead) + Channel.sep + "3"
    client.lpush(urgent, "dead-pri3")
    client.set(keys.worker_heartbeat(alive), "{}")  # late in its registry entry, yet alive
    client.lpush(keys.queue(MODEL), "shared-0")

    moved = OrphanQueues(client, me, heartbeat_ttl_s=3.0).sweep()

    assert moved == 4
    shared = [item.decode() for item in client.lrange(keys.queue(MODEL), 0, -1)]
    # Popped from the right: the dead worker's jobs first, oldest first, then the rest.
    assert shared == ["shared-0", "gone:2:b-2", "gone:2:b-1", "gone:2:b-0"]
    assert client.lrange(keys.queue(MODEL) + Channel.sep + "3", 0, -1) == [b"dead-pri3"]
    assert not client.exists(keys.worker_queue(MODEL, dead), urgent)
    assert client.llen(keys.worker_queue(MODEL, alive)) == 3
    # Kept in the registry (kombu may still restore an unacked copy there) ...
    assert client.zscore(keys.worker_queues(MODEL), dead) is not None
    # ... until it is older than the visibility timeout and empty.
    assert OrphanQueues(client, me, 3.0).move(dead, forget_before_ms=2) == 0
    assert client.zscore(keys.worker_queues(MODEL), dead) is None
    assert client.zscore(keys.worker_queues(MODEL), alive) is not None
    client.close()


def test_recent_prefixes_keep_the_most_recent_within_the_cache() -> None:
    def request(n: int) -> GenerateRequest:
        return GenerateRequest(job_id=str(n), model=MODEL,
                               prompt_token_ids=[n] * (2 * CHUNK_TOKENS))

    recent = RecentPrefixes(capacity=4)
    for n in range(3):
        recent.note(request(n))
    assert len(recent) == 4  # two fingerprints each, the oldest pushed out
    held = PrefixFilter.decode(recent.advertised())
    assert held.leading_matches(request_fingerprints(request(2))) == 2
    assert held.leading_matches(request_fingerprints(request(1))) == 2
    assert held.leading_matches(request_fingerprints(request(0))) == 0
    recent.note(request(1))  # used again: now the most recent
    recent.note(request(3))
    held = PrefixFilter.decode(recent.advertised())
    assert held.leading_matches(request_fingerprints(request(1))) == 2
    assert held.leading_matches(request_fingerprints(request(2))) == 0
    assert prefix_capacity(10 * CHUNK_TOKENS) == 10
    assert prefix_capacity(10**9) == MAX_ADVERTISED
    assert prefix_capacity(0) == 1
