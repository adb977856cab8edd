"""The watch over admitted, unclaimed jobs (``kvrelay_worker.jobs.fresh_watch``), on a
real Redis with the SDK's own admission: a message lost on its way to a worker (popped,
its reply never read) is pushed again once, marked picked in time; a job that waits its
turn is never pushed twice and is looked at less and less often; a claim ends the watch
and takes the kept message out of the record.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import redis

from kvrelay import AsyncClient
from kvrelay.event_log import MESSAGE_CHECKS_FIELD, MESSAGE_FIELD, PICKED_FIELD
from kvrelay.keys import Keyspace
from kvrelay_worker.jobs.fresh_watch import FreshWatch
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.queue_limit_advert import advertise_queue_limit
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

KEYS = Keyspace()
MODEL = "m"
LEASE_S = 1.0


@pytest.fixture
def store(clean_redis_url: str) -> JobStore:
    settings = WorkerSettings(redis_url=clean_redis_url, model_name=MODEL, lease_ttl=LEASE_S,
                              lease_refresh=0.3)
    job_store = JobStore(redis.Redis.from_url(clean_redis_url), settings)
    job_store.scripts.load()
    pipe = job_store.redis.pipeline()
    advertise_queue_limit(pipe, settings)  # what workers advertise: claim due in a lease
    pipe.execute()
    return job_store


@pytest.fixture
async def client(clean_redis_url: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False) as sdk:
        yield sdk


async def _enqueue(client: AsyncClient, count: int) -> list[str]:
    ids = []
    for i in range(count):
        stream = client.stream(prompt=f"fresh job {i}", max_tokens=4)
        await stream.start()
        ids.append(stream.job_id)
    return ids


def _queued_ids(direct: redis.Redis) -> list[str]:
    """Job ids in the shared queue, the next one a worker pops first."""
    return [json.loads(raw)["headers"]["id"]
            for raw in reversed(direct.lrange(KEYS.queue(MODEL), 0, -1))]


async def _wait_due() -> None:
    await asyncio.sleep(LEASE_S + 0.1)


async def test_a_message_lost_on_its_way_is_pushed_again_once(
        store: JobStore, client: AsyncClient) -> None:
    direct = store.redis
    ids = await _enqueue(client, 3)
    lost = json.loads(direct.rpop(KEYS.queue(MODEL)))  # a worker's pop whose reply never came
    assert lost["headers"]["id"] == ids[0]
    watch = FreshWatch(store, MODEL, store.settings.max_queue_wait)
    assert watch.sweep() == 0  # not due yet: a worker may still be claiming it
    await _wait_due()
    assert watch.sweep() == 1
    queued = _queued_ids(direct)
    assert queued == [ids[0], ids[1], ids[2]]  # back at the front, once
    copy = json.loads(direct.lindex(KEYS.queue(MODEL), -1))
    assert copy["headers"]["redelivered"] is True
    assert copy["body"] == lost["body"]
    assert direct.hget(KEYS.job_record(ids[0]), PICKED_FIELD) == b"1"
    assert direct.hget(KEYS.job_record(ids[1]), PICKED_FIELD) is None
    assert watch.sweep() == 0  # the copy is due a lease later, the others later still
    await _wait_due()
    assert watch.sweep() == 0
    assert _queued_ids(direct) == queued


async def test_a_job_waiting_its_turn_is_looked_at_less_and_less(
        store: JobStore, client: AsyncClient) -> None:
    direct = store.redis
    [job] = await _enqueue(client, 1)
    watch = FreshWatch(store, MODEL, store.settings.max_queue_wait)
    waits = []
    for checks in (1, 2):
        due_at = direct.zscore(KEYS.fresh_jobs(MODEL), job)
        assert due_at is not None
        await asyncio.sleep(max(0.0, due_at - _server_ms(direct)) / 1000 + 0.05)
        assert watch.sweep() == 0
        assert direct.hget(KEYS.job_record(job), MESSAGE_CHECKS_FIELD) == str(checks).encode()
        score = direct.zscore(KEYS.fresh_jobs(MODEL), job)
        assert score is not None
        waits.append(score - _server_ms(direct))
    assert waits[0] == pytest.approx(2 * LEASE_S * 1000, abs=300)
    assert waits[1] == pytest.approx(4 * LEASE_S * 1000, abs=300)
    assert direct.llen(KEYS.queue(MODEL)) == 1


async def test_a_claim_ends_the_watch(store: JobStore, client: AsyncClient) -> None:
    direct = store.redis
    [job] = await _enqueue(client, 1)
    record = KEYS.job_record(job)
    assert direct.hget(record, MESSAGE_FIELD) == direct.lindex(KEYS.queue(MODEL), 0)
    message = json.loads(direct.rpop(KEYS.queue(MODEL)))
    digest = direct.hget(record, "digest").decode()
    claim = store.claim(job, json.dumps({"from": message["headers"]["id"]}), digest)
    assert claim.status == "claimed"
    assert direct.zscore(KEYS.fresh_jobs(MODEL), job) is None
    assert direct.hget(record, MESSAGE_FIELD) is None
    await _wait_due()
    assert FreshWatch(store, MODEL, store.settings.max_queue_wait).sweep() == 0
    assert direct.llen(KEYS.queue(MODEL)) == 0


async def test_an_ended_unclaimed_job_takes_its_message_with_it(
        store: JobStore, client: AsyncClient) -> None:
    direct = store.redis
    [job] = await _enqueue(client, 1)
    direct.rpop(KEYS.queue(MODEL))
    store.fail_unclaimed(job, "cancelled", "cancelled before a worker claimed it")
    assert direct.hget(KEYS.job_record(job), MESSAGE_FIELD) is None
    assert direct.zscore(KEYS.fresh_jobs(MODEL), job) is None  # no id outlives its job
    await _wait_due()
    assert FreshWatch(store, MODEL, store.settings.max_queue_wait).sweep() == 0
    assert direct.llen(KEYS.queue(MODEL)) == 0


def _server_ms(direct: redis.Redis) -> float:
    seconds, micros = direct.time()
    return seconds * 1000 + micros / 1000
