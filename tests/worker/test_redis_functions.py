"""kvrelay's scripts as Redis Functions, for the default namespace: a worker loads the
library again when the server lost it (``FUNCTION FLUSH``: what a restart without
persistence leaves); a server without functions (Redis 6.2, as its ``HELLO`` answers)
runs the same scripts by ``EVALSHA``, loaded again after ``SCRIPT FLUSH``, and refuses
a namespace at start. (Before, every script ran by ``EVALSHA``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from helpers.redis_server import RedisServer

from kvrelay import AsyncClient, redis_functions
from kvrelay.keys import Keyspace
from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import NoFunctions
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.jobs.orphan_queues import OrphanQueues
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()


def _store(url: str, namespace: str = "") -> JobStore:
    return JobStore(redis.Redis.from_url(url),
                    WorkerSettings(redis_url=url, model_name="m", namespace=namespace))


def _calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


def _round_trip(store: JobStore, job_id: str) -> None:
    """Claim, a batch that ends the job, and a release: three scripts."""
    assert store.claim(job_id, '{"prompt": "p"}', "digest").status == "claimed"
    run = store.redis.get(KEYS.lease(job_id)).decode()  # type: ignore[union-attr]
    assert store.append_batch([JobEvents(job_id, events=[(0, True, b"\x90")],
                                         release=True, run=run)]) == [1]
    assert store.redis.hget(KEYS.job_record(job_id), "state") == b"done"


def test_a_worker_loads_the_functions_again_after_they_were_flushed(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    store = _store(redis_server_factory().url)
    store.scripts.prepare()
    assert store.redis.function_list(library=LIBRARY.name)
    _round_trip(store, "a")
    store.redis.execute_command("FUNCTION", "FLUSH")
    _round_trip(store, "b")
    assert store.redis.function_list(library=LIBRARY.name)
    store.redis.execute_command("FUNCTION", "FLUSH")
    orphans = OrphanQueues(store.redis, store.settings, heartbeat_ttl_s=1.0)
    store.redis.lpush(KEYS.worker_queue("m", "gone"), b"job")
    assert orphans.move("gone") == 1
    assert store.redis.function_list(library=LIBRARY.name)


async def test_without_functions_the_same_scripts_run_by_evalsha(
        redis_server_factory: Callable[[], RedisServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What Redis 6.2's HELLO answers (the probe's only input).
    monkeypatch.setattr(redis_functions, "_version_major", lambda reply: 6)
    url = redis_server_factory().url
    store = _store(url)
    store.scripts.prepare()
    before = _calls(store.redis)
    _round_trip(store, "a")
    store.redis.script_flush()
    _round_trip(store, "b")
    async with AsyncClient(url, model="m", require_worker=False, max_queue=10,
                           connect_timeout=3, reconnect_timeout=3) as client:
        async with client.stream(prompt_token_ids=[1, 2], max_tokens=2):
            assert await client.queue_length("m") == 1
    after = _calls(store.redis)
    assert not store.redis.function_list()
    assert after.get("fcall", 0) == before.get("fcall", 0)
    # claim, batch, claim (NOSCRIPT), claim, batch; reserve (NOSCRIPT) and reserve.
    # Each job: claim (NOSCRIPT first: all scripts loaded), claim, batch; the client's
    # reserve and admission.
    assert after.get("evalsha", 0) - before.get("evalsha", 0) == 3 + 3 + 2
    assert after.get("script|load", 0) - before.get("script|load", 0) == 2 * len(LIBRARY.scripts)
    with pytest.raises(NoFunctions, match="Redis >= 7"):
        _store(url, namespace="alpha").scripts.prepare()
