"""The replay log's rule, by construction: every event of a job is in its log or in its
owner's tail, whether or not the job has sent anything for a while.

Driven through the real publisher against a real Redis: jobs that go quiet (a preempted
or slow job) while others fill the tail far past its length, claims by another worker
at random moments, and what a reader and a new owner find then. (Before quiet jobs'
events were moved on the batch that would trim them, a job quiet for more than the
tail's length lost them: its next owner resumed from the log's older end and the
stream got a seq twice.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrelay import event_log
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, Tokens, decode_event
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import TAIL_MAX_LEN, JobStore, PriorProgress
from kvrelay_worker.jobs.publisher import EventItem, Publisher
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()


@pytest.fixture
def client(clean_redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(clean_redis_url) as connection:
        yield connection


def _store(client: redis.Redis, url: str, worker: str) -> JobStore:
    return JobStore(client, WorkerSettings(redis_url=url, model_name="m", worker_id=worker))


def _job(job_id: str) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="m", prompt_token_ids=[1, 2])
    return ActiveJob(job_id=job_id, request=request, payload_json="{}",
                     params=SamplingParams(max_tokens=4), prompt_ids=[1, 2], attempt=1,
                     prior=PriorProgress(), run_id=f"w1#{job_id}")


def _claimed(store: JobStore, job: ActiveJob) -> None:
    """What this worker's claim of ``job`` leaves (the run's lease, the record)."""
    store.redis.set(KEYS.lease(job.job_id), job.run_id)
    store.redis.hset(KEYS.job_record(job.job_id), mapping={
        "state": "running", event_log.OWNER_FIELD: store.worker_id, "run": job.run_id,
        event_log.DIGEST_FIELD: "d"})


def _publisher(store: JobStore) -> Publisher:
    return Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                     on_fenced=lambda job: None)


def _token(value: int) -> Tokens:
    return Tokens(seq=0, token_ids=[value], text=f"<{value}>")


def _read(url: str, job_id: str) -> list[tuple[int, list[int]]]:
    """(seq, token ids) of every event a reader finds (log, then the owner's tail)."""
    async def read() -> list[tuple[int, list[int]]]:
        async with aioredis.Redis.from_url(url) as reader:
            found = await event_log.read_after(reader, KEYS, job_id, -1, page=50)
        events = [decode_event(bytes(raw)) for raw in found]
        return [(e.seq, list(e.token_ids)) for e in events if isinstance(e, Tokens)]
    return asyncio.run(read())


def test_a_quiet_jobs_events_reach_its_log_before_the_tail_drops_them(
        client: redis.Redis, clean_redis_url: str) -> None:
    store = _store(client, clean_redis_url, "w1")
    publisher = _publisher(store)
    quiet, busy = _job("quiet"), _job("busy")
    _claimed(store, quiet)
    _claimed(store, busy)
    for i in range(3):
        publisher._process([EventItem(quiet, _token(i)), EventItem(busy, _token(i))])
    for i in range(3, 3 + 2 * TAIL_MAX_LEN):  # quiet is preempted; busy goes on
        publisher._process([EventItem(busy, _token(i))])
    assert _read(clean_redis_url, "quiet") == [(0, [0]), (1, [1]), (2, [2])]
    # And a new owner's claim (the quiet job's lease ran out) resumes after them.
    client.delete(KEYS.lease("quiet"))
    claim = _store(client, clean_redis_url, "w2").claim("quiet", "{}", "d", "w2#1")
    assert claim.status == "claimed"
    assert claim.progress is not None
    assert claim.progress.next_seq == 3


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=st.lists(st.sets(st.integers(0, 5), max_size=6), min_size=1,
                     max_size=4 * TAIL_MAX_LEN),
       claim_at=st.integers(0, 4 * TAIL_MAX_LEN))
def test_every_event_is_in_the_log_or_the_tail(
        client: redis.Redis, clean_redis_url: str,
        plan: list[set[int]], claim_at: int) -> None:
    """Six jobs; each batch sends a token for some of them (the others stay quiet for
    any number of batches); at one random batch another worker claims job 0. Every
    other job's reader then finds every token it was sent, seq by seq; job 0's new owner
    resumes exactly after what the old run wrote before the claim."""
    client.flushdb()
    store = _store(client, clean_redis_url, "w1")
    publisher = _publisher(store)
    jobs = [_job(f"j{i}") for i in range(6)]
    for job in jobs:
        _claimed(store, job)
    sent: dict[int, list[int]] = {i: [] for i in range(6)}
    claimed_next: int | None = None
    for step, senders in enumerate(plan):
        if step == claim_at:
            client.delete(KEYS.lease("j0"))  # w1 stalled past its lease
            claim = _store(client, clean_redis_url, "w2").claim("j0", "{}", "d", "w2#1")
            assert claim.status == "claimed"
            assert claim.progress is not None
            claimed_next = claim.progress.next_seq
            assert claimed_next == len(sent[0])
        items = [EventItem(jobs[i], _token(step)) for i in sorted(senders)
                 if not (i == 0 and claimed_next is not None)]
        for item in items:
            sent[jobs.index(item.job)].append(step)
        if items:
            publisher._process(items)
    for i in range(1, 6):
        found = _read(clean_redis_url, f"j{i}")
        assert [seq for seq, _ in found] == list(range(len(sent[i]))), f"j{i}"
        assert [t for _, tokens in found for t in tokens] == sent[i], f"j{i}"


def test_a_claim_moves_the_previous_owners_requeued_jobs_out_of_its_tail(
        client: redis.Redis, clean_redis_url: str) -> None:
    """w1 dies (its leases gone) with four jobs: two a watch requeued, one still marked
    running (not yet requeued), one ended. The first claim of a requeued one moves the
    other requeued job's tail-only events into its log too, so its own claim finds them
    whenever it comes (before, only the claimed job's were, and a claim after the tail
    expired resumed from the log's older end: chaos seed 70). The running job is left
    alone (its owner may be alive, after an outage) and keeps the tail alive; once no job
    of w1 runs any more, the tail lives no longer than an ended job's log."""
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", worker_id="w1",
                              log_ttl=60.0, log_live_ttl=3600.0)
    store = JobStore(client, settings)
    publisher = _publisher(store)
    jobs = {name: _job(name) for name in ("first", "second", "running", "ended")}
    for job in jobs.values():
        _claimed(store, job)
    for i in range(3):
        publisher._process([EventItem(job, _token(i)) for job in jobs.values()])
    assert client.xlen(KEYS.event_log("second")) == 0  # only in the tail so far
    client.delete(*(KEYS.lease(name) for name in jobs))
    for name in ("first", "second"):
        client.hset(KEYS.job_record(name), "state", "queued")
    client.hset(KEYS.job_record("ended"), "state", "done")
    w2 = JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                         worker_id="w2", log_ttl=60.0, log_live_ttl=3600.0))
    first = w2.claim("first", "{}", "d", "w2#1")
    assert first.status == "claimed"
    assert first.progress is not None
    assert first.progress.next_seq == 3
    assert client.xlen(KEYS.event_log("second")) == 1
    assert client.xlen(KEYS.event_log("running")) == 0
    assert client.hget(KEYS.job_record("running"), "run") == b"w1#running"
    assert client.ttl(store.tail_key) > 3600  # the running job's events still need it
    client.delete(store.tail_key)  # however long the tail lives, "second" has its events
    second = w2.claim("second", "{}", "d", "w2#2")
    assert second.progress is not None
    assert second.progress.next_seq == 3


def test_a_dead_workers_tail_goes_once_none_of_its_jobs_runs(
        client: redis.Redis, clean_redis_url: str) -> None:
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", worker_id="w1",
                              log_ttl=60.0, log_live_ttl=3600.0)
    store = JobStore(client, settings)
    publisher = _publisher(store)
    requeued, ended = _job("requeued"), _job("ended")
    _claimed(store, requeued)
    _claimed(store, ended)
    publisher._process([EventItem(requeued, _token(0)), EventItem(ended, _token(0))])
    assert client.ttl(store.tail_key) > 3600
    client.delete(KEYS.lease("requeued"), KEYS.lease("ended"))
    client.hset(KEYS.job_record("requeued"), "state", "queued")
    client.hset(KEYS.job_record("ended"), "state", "done")
    w2 = JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                         worker_id="w2", log_ttl=60.0))
    assert w2.claim("requeued", "{}", "d", "w2#1").status == "claimed"
    assert 0 < client.ttl(store.tail_key) <= 60
    # Had w1 been alive after all, its next batch gives its tail back its own expiry.
    again = _job("again")
    _claimed(store, again)
    publisher._process([EventItem(again, _token(0))])
    assert client.ttl(store.tail_key) > 3600


def test_the_tail_lives_as_long_as_a_running_jobs_log_while_it_holds_its_events(
        client: redis.Redis, clean_redis_url: str) -> None:
    """Until its jobs' next owner claims them, a dead worker's tail is the only copy of
    their latest events: it must not expire before their records (before, it lived an
    ended job's log time, an hour by default, 4 s in the chaos harness: seed 70)."""
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", worker_id="w1",
                              log_ttl=60.0, log_live_ttl=3600.0)
    store = JobStore(client, settings)
    publisher = _publisher(store)
    job = _job("j")
    _claimed(store, job)
    publisher._process([EventItem(job, _token(0))])
    assert client.ttl(store.tail_key) > 3600
    publisher._process([EventItem(job, Finished(seq=0, finish_reason="stop"),
                                  Outcome.FINISHED)])
    assert 0 < client.ttl(store.tail_key) <= 60
