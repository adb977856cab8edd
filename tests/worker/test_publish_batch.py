"""The publisher's batched script against a real Redis: one call per batch, fenced per job,
nothing published twice, coalescing that keeps ``seq`` contiguous."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from kvrelay import event_log
from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, Started, Tokens, Usage, decode_event
from kvrelay_worker.active_job import ActiveJob, Outcome
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.job_store import JobEvents, JobStore, PriorProgress
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.publisher import EventItem, Item, Publisher, coalesce
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", log_ttl=50,
                              log_live_ttl=800)
    yield JobStore(client, settings)
    client.close()


def _job(job_id: str) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="m", prompt_token_ids=[1, 2])
    return ActiveJob(job_id=job_id, request=request, payload_json="{}",
                     params=SamplingParams(max_tokens=4), prompt_ids=[1, 2], attempt=1,
                     prior=PriorProgress())


def _tokens(ids: list[int], index: int = 0) -> Tokens:
    return Tokens(seq=0, token_ids=ids, text="".join(f"<{i}>" for i in ids), index=index)


def _log(client: redis.Redis, job_id: str) -> list[tuple[int, object]]:
    entries = client.xrange(KEYS.event_log(job_id))
    field = event_log.EVENT_FIELD.encode()
    return [(event_log.seq_of_entry_id(entry_id), decode_event(fields[field]))
            for entry_id, fields in entries]


def _calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


def _delta(before: dict[str, int], after: dict[str, int], name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


def test_a_stale_owners_job_writes_nothing_while_the_batchs_other_jobs_are_written(
        store: JobStore) -> None:
    a, stale, c = _job("a"), _job("stale"), _job("c")
    for job in (a, c):
        store.redis.set(KEYS.lease(job.job_id), store.worker_id)
    store.redis.set(KEYS.lease(stale.job_id), "the-new-owner")
    fenced: list[str] = []
    publisher = Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                          on_fenced=lambda job: fenced.append(job.job_id))
    pubsub = store.redis.pubsub()
    pubsub.subscribe(*(KEYS.events_channel(j.job_id) for j in (a, stale, c)))
    for _ in range(3):
        assert pubsub.get_message(timeout=1.0) is not None  # the subscribe confirmations
    warm = _job("warm-up")  # loads the script: a first call may meet NOSCRIPT
    store.redis.set(KEYS.lease(warm.job_id), store.worker_id)
    publisher._process([EventItem(warm, _tokens([0]))])
    before = _calls(store.redis)
    publisher._process([
        EventItem(a, Started(seq=0, worker="w")), EventItem(stale, _tokens([5])),
        EventItem(c, _tokens([7])), EventItem(a, _tokens([1])), EventItem(stale, _tokens([6])),
        EventItem(c, _finished(), Outcome.FINISHED)])
    after = _calls(store.redis)

    assert _log(store.redis, "stale") == []
    assert fenced == ["stale", "stale"]  # each of its events: the engine is told to stop it
    assert [(seq, type(e).__name__) for seq, e in _log(store.redis, "a")] == [
        (0, "Started"), (1, "Tokens")]
    assert [(seq, type(e).__name__) for seq, e in _log(store.redis, "c")] == [
        (0, "Tokens"), (1, "Finished")]
    assert c.done.is_set()
    assert c.outcome == Outcome.FINISHED
    published = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        published.append((message["channel"].decode(), decode_event(message["data"]).seq))
    pubsub.close()
    assert sorted(published) == sorted([(KEYS.events_channel("a"), 0),
                                        (KEYS.events_channel("a"), 1),
                                        (KEYS.events_channel("c"), 0),
                                        (KEYS.events_channel("c"), 1)])
    # One script call for the batch, one lease read for all its jobs, no read of the log.
    assert _delta(before, after, "evalsha") == 1
    assert _delta(before, after, "mget") == 1
    assert _delta(before, after, "get") == 0
    assert _delta(before, after, "xrevrange") == 0
    assert _delta(before, after, "xadd") == _delta(before, after, "publish") == 4
    # Expiry once per job: a's live one, c's ended one.
    assert _delta(before, after, "expire") == 2
    assert 800 < store.redis.ttl(KEYS.event_log("a")) <= 900  # live TTL + its refresh
    assert 0 < store.redis.ttl(KEYS.event_log("c")) <= 50


def _finished() -> Finished:
    return Finished(seq=0, finish_reason="length", finish_reasons=["length"],
                    usage=Usage(prompt_tokens=2, completion_tokens=1, cached_tokens=0))


def test_a_retried_batch_writes_and_publishes_nothing_twice(store: JobStore) -> None:
    store.redis.set(KEYS.lease("j"), store.worker_id)
    data = [(0, False, b"\x81\xa1x\x01"), (1, True, b"\x81\xa1x\x02")]
    assert store.append_batch([JobEvents("j", list(data))]) == [0, 1]
    before = _calls(store.redis)
    assert store.append_batch([JobEvents("j", list(data))]) == [
        AppendResult.ALREADY_WRITTEN, AppendResult.ALREADY_WRITTEN]
    after = _calls(store.redis)
    assert _delta(before, after, "publish") == 0
    assert len(store.redis.xrange(KEYS.event_log("j"))) == 2


def test_the_log_expiry_is_refreshed_per_job_not_per_event(store: JobStore) -> None:
    job = _job("j")
    store.redis.set(KEYS.lease(job.job_id), store.worker_id)
    publisher = Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                          on_fenced=lambda job: None)
    before = _calls(store.redis)
    for i in range(5):
        publisher._process([EventItem(job, _tokens([i]))])
    assert _delta(before, _calls(store.redis), "expire") == 1  # the first batch only
    # Once due (an eighth of the live TTL later), the next batch refreshes it.
    assert job.log_expiry_refresh_at is not None
    job.log_expiry_refresh_at = time.monotonic() - 1
    store.redis.expire(KEYS.event_log(job.job_id), 5)
    publisher._process([EventItem(job, _tokens([9]))])
    assert store.redis.ttl(KEYS.event_log(job.job_id)) > 800
    assert [seq for seq, _ in _log(store.redis, job.job_id)] == list(range(6))


def test_coalesce_merges_interleaved_choices_per_choice() -> None:
    a = _job("a")
    items: list[Item] = [EventItem(a, _tokens([1], 0)), EventItem(a, _tokens([2], 1)),
                         EventItem(a, _tokens([3], 0)), EventItem(a, _tokens([4], 1))]
    out = coalesce(items)
    assert [(i.event.index, i.event.token_ids) for i in out  # type: ignore[union-attr]
            if isinstance(i, EventItem)] == [(0, [1, 3]), (1, [2, 4])]


def test_steps_queued_behind_a_batch_in_flight_go_out_merged_with_contiguous_seq(
        store: JobStore, clean_redis_url: str) -> None:
    """While Redis holds the first batch (writes paused), nine more steps of two jobs
    queue up; they leave merged, one event per job, numbered right after the first."""
    jobs = [_job("x"), _job("y")]
    for job in jobs:
        store.redis.set(KEYS.lease(job.job_id), store.worker_id)
    publisher = Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                          on_fenced=lambda job: None)
    publisher.start()
    admin = redis.Redis.from_url(clean_redis_url)
    try:
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        publisher.put([EventItem(job, _tokens([0])) for job in jobs])
        _wait_until(lambda: publisher._queue.empty())  # the first batch is in flight
        for step in range(1, 10):
            publisher.put([EventItem(job, _tokens([step])) for job in jobs])
        admin.execute_command("CLIENT", "UNPAUSE")
        for job in jobs:
            _wait_until(lambda job=job: _tokens_in_log(store.redis, job.job_id) == 10)
            log = _log(store.redis, job.job_id)
            # Two round trips at most: the one held, then everything queued behind it.
            assert [seq for seq, _ in log] == [0, 1]
            merged = [t for _, e in log for t in e.token_ids]  # type: ignore[attr-defined]
            assert merged == list(range(10))
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        publisher.stop()


def _tokens_in_log(client: redis.Redis, job_id: str) -> int:
    return sum(len(e.token_ids) for _, e in _log(client, job_id)  # type: ignore[attr-defined]
               if isinstance(e, Tokens))


def _wait_until(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

