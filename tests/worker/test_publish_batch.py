"""The publisher's batched script against a real Redis: one call per batch, reading no job
until another worker has taken one of this worker's (then fenced per job) or a stream
watches one, one tail entry and one message per client per batch, events moved into the logs every few
batches and whenever a job ends or changes hands, coalescing that keeps ``seq``
contiguous."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from helpers.takeover import taken_over
from helpers.takeover import watched as watched_by_a_stream

from kvrelay import event_log
from kvrelay.event_frames import unpack_events, unpack_message
from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, GenerateRequest, Started, Tokens, Usage, decode_event
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import TAIL_MAX_LEN, JobEvents, JobStore, PriorProgress
from kvrelay_worker.jobs.publisher import (
    LOG_MOVE_BATCHES,
    DoneItem,
    EventItem,
    Item,
    Publisher,
    coalesce,
)
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m", log_ttl=50,
                              log_live_ttl=800)
    yield JobStore(client, settings)
    client.close()


def _job(job_id: str, reply_to: str | None = None) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="m", prompt_token_ids=[1, 2],
                              reply_to=reply_to)
    return ActiveJob(job_id=job_id, request=request, payload_json="{}",
                     params=SamplingParams(max_tokens=4), prompt_ids=[1, 2], attempt=1,
                     prior=PriorProgress())


def _tokens(ids: list[int], index: int = 0) -> Tokens:
    return Tokens(seq=0, token_ids=ids, text="".join(f"<{i}>" for i in ids), index=index)


def _log(client: redis.Redis, job_id: str) -> list[tuple[int, list[object]]]:
    """(entry's last seq, its events) per log entry."""
    entries = client.xrange(KEYS.event_log(job_id))
    field = event_log.EVENT_FIELD.encode()
    return [(event_log.seq_of_entry_id(entry_id),
             [decode_event(bytes(raw)) for raw in unpack_events(fields[field])])
            for entry_id, fields in entries]


def _everything(url: str, job_id: str) -> list[object]:
    """The job's events as a reader gets them (log, then its owner's tail)."""
    async def read() -> list[object]:
        client = aioredis.Redis.from_url(url)
        try:
            found = await event_log.read_after(client, KEYS, job_id, -1, page=10)
        finally:
            await client.aclose()
        return [decode_event(bytes(raw)) for raw in found]
    return asyncio.run(read())


def _calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


def _delta(before: dict[str, int], after: dict[str, int], name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


def _own(store: JobStore, *jobs: ActiveJob) -> None:
    """Hold the jobs' leases, as a claim does (and name this worker their owner, and its
    id their run: what a run id defaults to)."""
    for job in jobs:
        store.redis.set(KEYS.lease(job.job_id), store.worker_id)
        store.redis.hset(KEYS.job_record(job.job_id), mapping={
            event_log.OWNER_FIELD: store.worker_id, "run": store.worker_id})


def _publisher(store: JobStore, fenced: list[str] | None = None) -> Publisher:
    return Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                     on_fenced=lambda job: fenced.append(job.job_id) if fenced is not None
                     else None)


def test_one_batch_is_one_script_call_one_tail_entry_and_one_message_per_client(
        store: JobStore, clean_redis_url: str) -> None:
    a, c = _job("a", "reply-1"), _job("c", "reply-1")
    other, watched = _job("other", "reply-2"), _job("watched", "reply-2")
    _own(store, a, c, other, watched)
    publisher = _publisher(store)
    pubsub = store.redis.pubsub()
    channels = ["reply-1", "reply-2", *(KEYS.events_channel(j) for j in ("a", "watched"))]
    pubsub.subscribe(*channels)
    for _ in channels:
        assert pubsub.get_message(timeout=1.0) is not None  # the subscribe confirmations
    warm = _job("warm-up")  # loads the script: a first call may meet NOSCRIPT
    _own(store, warm)
    publisher._process([EventItem(warm, _tokens([0]))])
    watched_by_a_stream(store.redis, watched.job_id)  # a stream elsewhere resumed it
    before = _calls(store.redis)
    publisher._process([
        EventItem(a, Started(seq=0, worker="w")), EventItem(c, _tokens([7])),
        EventItem(a, _tokens([1])), EventItem(other, _tokens([8])),
        EventItem(watched, _tokens([9])), EventItem(c, _finished(), Outcome.FINISHED)])
    after = _calls(store.redis)

    # Nothing of a running job is in its log yet: its events wait in this worker's tail.
    assert _log(store.redis, "a") == []
    assert [(type(e).__name__, e.seq) for e in _everything(clean_redis_url, "a")] == [
        ("Started", 0), ("Tokens", 1)]
    # The job that ended is in its log, as one entry.
    assert [(seq, [type(e).__name__ for e in events]) for seq, events in _log(store.redis, "c")
            ] == [(1, ["Tokens", "Finished"])]
    assert c.done.is_set()
    assert c.outcome == Outcome.FINISHED
    published: dict[str, list[tuple[str, list[int]]]] = {}
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        pairs = unpack_message(message["data"])
        published.setdefault(message["channel"].decode(), []).extend(
            (job_id, [decode_event(bytes(raw)).seq for raw in unpack_events(events)])
            for job_id, events in pairs)
    pubsub.close()
    assert published == {
        "reply-1": [("a", [0, 1]), ("c", [0, 1])],
        "reply-2": [("other", [0]), ("watched", [0])],
        KEYS.events_channel("watched"): [("watched", [0])],
    }
    # A stream watches a job: the fast call (one look at the fence flag and the watching
    # set) is refused, and the batch comes again with every job's lease and watcher
    # count (one read); no log read; one tail entry and one log entry (c's); one message
    # per client and one per watched job; c, which ended, released in the same call
    # (one look at its lease).
    assert _delta(before, after, "fcall") == 2
    assert _delta(before, after, "exists") == 1
    assert _delta(before, after, "mget") == 1
    assert _delta(before, after, "get") == 1
    assert _delta(before, after, "xrevrange") == 0
    assert _delta(before, after, "xadd") == 2
    assert _delta(before, after, "publish") == 3
    # Expiry: c's ended log and record; none per event. The tail's was set by the first
    # batch and is only looked at (one PTTL) until an eighth of it has passed: it holds
    # a's, other's and watched's events, in no log yet, so it lives as long as a running
    # job's log (800 s, and an eighth for its refresh).
    assert _delta(before, after, "expire") == 2
    assert _delta(before, after, "pttl") == 1
    assert 0 < store.redis.ttl(KEYS.event_log("c")) <= 50
    assert 0 < store.redis.ttl(KEYS.job_record("c")) <= 50
    assert 800 < store.redis.ttl(store.tail_key) <= 900
    assert c.released
    assert not a.released
    # The next batch, within a second, checks each job at once: no refused call first.
    before = _calls(store.redis)
    publisher._process([EventItem(a, _tokens([3])), EventItem(watched, _tokens([4]))])
    assert _delta(before, _calls(store.redis), "fcall") == 1


def test_while_no_job_was_taken_or_is_watched_a_batch_reads_no_job(
        store: JobStore, clean_redis_url: str) -> None:
    """The fast path: one look at two keys, whatever the batch holds; a lease that expired
    unclaimed does not stop the writes (only a claim by another worker does)."""
    jobs = [_job(f"j{i}", "reply-1") for i in range(40)]
    _own(store, *jobs)
    publisher = _publisher(store)
    publisher._process([EventItem(job, _tokens([0])) for job in jobs])  # loads the script
    store.redis.delete(KEYS.lease("j7"))  # expired; nobody claimed it
    before = _calls(store.redis)
    publisher._process([EventItem(job, _tokens([1])) for job in jobs])
    after = _calls(store.redis)
    assert _delta(before, after, "fcall") == 1
    assert _delta(before, after, "exists") == 1
    assert _delta(before, after, "mget") == 0
    assert _delta(before, after, "get") == 0
    assert [e.seq for e in _everything(clean_redis_url, "j7")] == [0, 1]  # type: ignore[attr-defined]
    [entry] = store.redis.xrevrange(store.tail_key, count=1)
    assert list(entry[1]) == [event_log.TAIL_FIELD.encode()]  # one field for the batch
    records = list(event_log.tail_records(entry[1][event_log.TAIL_FIELD.encode()]))
    assert [(job_id, seq, ended) for job_id, seq, ended, _ in records] == [
        (job.job_id, 1, False) for job in jobs]


def test_a_stale_owners_job_writes_nothing_while_the_batchs_other_jobs_are_written(
        store: JobStore, clean_redis_url: str) -> None:
    a, stale = _job("a", "reply-1"), _job("stale", "reply-1")
    _own(store, a)
    taken_over(store, stale.job_id, "the-new-owner")
    fenced: list[str] = []
    publisher = _publisher(store, fenced)
    pubsub = store.redis.pubsub()
    pubsub.subscribe("reply-1")
    assert pubsub.get_message(timeout=1.0) is not None
    publisher._process([EventItem(a, _tokens([1])), EventItem(stale, _tokens([5])),
                        EventItem(stale, _tokens([6], 1)), EventItem(a, _tokens([2], 1))])
    assert fenced == ["stale", "stale"]  # each of its events: the engine is told to stop it
    assert _everything(clean_redis_url, "stale") == []
    assert [e.seq for e in _everything(clean_redis_url, "a")] == [0, 1]  # type: ignore[attr-defined]
    message = pubsub.get_message(timeout=1.0)
    pubsub.close()
    assert message is not None
    assert [job_id for job_id, _ in unpack_message(message["data"])] == ["a"]


def test_a_fenced_jobs_later_events_are_never_sent(store: JobStore) -> None:
    """Once a batch finds a job another's, the run's later events (already made by the
    engine before it heard) go nowhere: sent, they could land where the refused ones
    did not (seed 10017: a batch past the fence went unchecked and left a gap)."""
    stale = _job("stale", "reply-1")
    taken_over(store, stale.job_id, "the-new-owner")
    fenced: list[str] = []
    publisher = _publisher(store, fenced)
    publisher._process([EventItem(stale, _tokens([5]))])
    assert fenced == ["stale"]
    before = _calls(store.redis)
    publisher._process([EventItem(stale, _tokens([6])),
                        EventItem(stale, _finished(), outcome=Outcome.FINISHED)])
    assert _delta(before, _calls(store.redis), "fcall") == 0
    assert stale.outcome == Outcome.FENCED
    assert fenced == ["stale"]


def test_a_tail_left_with_a_running_jobs_expiry_is_shortened(store: JobStore) -> None:
    """A batch whose fenced job had tail-only events gave the tail a running job's
    expiry; with those jobs dropped and the last one ended, nothing running is left in
    it, and its expiry is an ended job's log's (chaos seed 10017: the tail of a worker
    cut off while its jobs were taken over kept events of ended jobs for 97 s)."""
    own, stale = _job("own", "reply-1"), _job("stale", "reply-1")
    _running(store, own)
    taken_over(store, stale.job_id, "the-new-owner")
    publisher = _publisher(store, [])
    publisher._process([EventItem(stale, _tokens([5])), EventItem(own, _tokens([1])),
                        EventItem(own, _finished(), Outcome.FINISHED)])
    assert own.outcome == Outcome.FINISHED
    assert 0 < store.redis.ttl(store.tail_key) <= store.ended_ttl_s


def _finished() -> Finished:
    return Finished(seq=0, finish_reason="length", finish_reasons=["length"],
                    usage=Usage(prompt_tokens=2, completion_tokens=1, cached_tokens=0))


def _running(store: JobStore, job: ActiveJob) -> None:
    """What a claim leaves: the record running with its payload, the lease, the zset."""
    _own(store, job)
    store.redis.hset(KEYS.job_record(job.job_id), mapping={"state": "running",
                                                           "payload": "{}"})
    store.redis.zadd(store.running_key, {job.job_id: 1})


def _record(store: JobStore, job_id: str) -> dict[str, str]:
    raw = store.redis.hgetall(KEYS.job_record(job_id))
    return {k.decode(): v.decode() for k, v in raw.items()}  # type: ignore[union-attr]


def test_the_batch_that_writes_a_jobs_end_releases_it_in_the_same_call(
        store: JobStore, clean_redis_url: str) -> None:
    """No round trip of its own for a job's end: the record says done (payload dropped,
    an ended log's expiry), the lease and the running entry are gone, and the task
    thread finds nothing left to release."""
    ended, going_on = _job("ended"), _job("going-on")
    _running(store, ended)
    _running(store, going_on)
    publisher = _publisher(store)
    publisher._process([EventItem(going_on, _tokens([0]))])  # loads the script
    before = _calls(store.redis)
    publisher._process([EventItem(ended, _tokens([1])),
                        EventItem(ended, _finished(), Outcome.FINISHED),
                        EventItem(going_on, _tokens([2]))])
    assert _delta(before, _calls(store.redis), "fcall") == 1
    assert ended.outcome == Outcome.FINISHED
    assert ended.released
    assert _record(store, "ended")["state"] == "done"
    assert _record(store, "ended")["payload"] == ""
    assert 0 < store.redis.ttl(KEYS.job_record("ended")) <= 50
    assert not store.redis.exists(KEYS.lease("ended"))
    assert store.redis.zscore(store.running_key, "ended") is None
    assert [type(e).__name__ for e in _everything(clean_redis_url, "ended")] == [
        "Tokens", "Finished"]
    # The job still running keeps all of it.
    assert not going_on.released
    assert _record(store, "going-on")["state"] == "running"
    assert store.redis.get(KEYS.lease("going-on")) == store.worker_id.encode()
    assert store.redis.zscore(store.running_key, "going-on") == 1


def test_a_job_handed_on_is_not_released_but_one_whose_lease_ran_out_is(
        store: JobStore) -> None:
    """A fenced job ends without a write. A lease that ran out unclaimed (Redis was out of
    reach) while the record still names this run is still this run's: its last batch
    marks it done. Left running without a lease, the watchdog would run it again and
    its second run would publish seqs the client already has."""
    stale, expired = _job("stale"), _job("expired")
    _running(store, stale)
    _running(store, expired)
    publisher = _publisher(store, [])
    publisher._process([EventItem(expired, _tokens([0]))])
    store.redis.delete(KEYS.lease("expired"))
    publisher._process([EventItem(expired, _finished(), Outcome.FINISHED)])
    assert _record(store, "expired")["state"] == "done"
    assert store.redis.zscore(store.running_key, "expired") is None
    assert expired.released
    taken_over(store, "stale", "the-new-owner")
    publisher._process([EventItem(stale, _finished(), Outcome.FINISHED)])
    assert stale.outcome == Outcome.FENCED
    assert not stale.released
    assert _record(store, "stale")["state"] == "running"
    assert store.redis.get(KEYS.lease("stale")) == b"the-new-owner#1"


def test_an_ending_batch_sent_again_after_its_reply_was_lost_is_not_fenced_by_itself(
        store: JobStore) -> None:
    """Checked job by job (a stream watches it), the retry finds the lease its first
    try dropped; the record shows this run ended the job, so it is written, not
    fenced. Had another run taken the job and ended it, it would be fenced."""
    _running(store, _job("j"))
    watched_by_a_stream(store.redis, "j")
    data = [(0, False, b"\x81\xa1x\x01"), (1, True, b"\x81\xa1x\x02")]
    batch = JobEvents("j", "", list(data), moved=[d for _, _, d in data], moved_last=1,
                      release=True)
    assert store.append_batch([batch]) == [1]
    assert _record(store, "j")["state"] == "done"
    assert store.append_batch([batch]) == [1]  # the reply of the first try was lost
    assert len(store.redis.xrange(KEYS.event_log("j"))) == 1
    store.redis.hset(KEYS.job_record("j"), mapping={event_log.OWNER_FIELD: "the-new-owner",
                                                    "run": "the-new-owner#1"})
    assert store.append_batch([batch]) == [AppendResult.FENCED]


def test_a_jobs_events_move_from_the_tail_to_its_log_every_few_batches(
        store: JobStore, clean_redis_url: str) -> None:
    job = _job("j")
    _own(store, job)
    publisher = _publisher(store)
    for i in range(LOG_MOVE_BATCHES - 1):
        publisher._process([EventItem(job, _tokens([i]))])
    assert _log(store.redis, "j") == []
    before = _calls(store.redis)
    publisher._process([EventItem(job, _tokens([99]))])
    assert _delta(before, _calls(store.redis), "xadd") == 2  # the tail's entry, the log's
    [(last, events)] = _log(store.redis, "j")
    assert last == LOG_MOVE_BATCHES - 1
    assert [e.seq for e in events] == list(range(LOG_MOVE_BATCHES))  # type: ignore[attr-defined]
    assert job.unlogged == []
    # The log got its live expiry with that move; the next batches wait in the tail again.
    assert 800 < store.redis.ttl(KEYS.event_log("j")) <= 900
    publisher._process([EventItem(job, _tokens([100]))])
    assert len(_log(store.redis, "j")) == 1
    assert [e.seq for e in _everything(clean_redis_url, "j")] == list(  # type: ignore[attr-defined]
        range(LOG_MOVE_BATCHES + 1))
    # The tail keeps no more batches than its cap.
    for i in range(TAIL_MAX_LEN + 5):
        publisher._process([EventItem(job, _tokens([i]))])
    assert store.redis.xlen(store.tail_key) == TAIL_MAX_LEN
    assert [e.seq for e in _everything(clean_redis_url, "j")] == list(  # type: ignore[attr-defined]
        range(LOG_MOVE_BATCHES + TAIL_MAX_LEN + 6))


def test_a_retried_batch_writes_no_log_entry_twice(store: JobStore) -> None:
    _own(store, _job("j"))
    data = [(0, False, b"\x81\xa1x\x01"), (1, True, b"\x81\xa1x\x02")]
    batch = JobEvents("j", "", list(data), moved=[d for _, _, d in data], moved_last=1)
    assert store.append_batch([batch]) == [1]
    assert store.append_batch([batch]) == [1]  # the reply of the first try was lost
    assert len(store.redis.xrange(KEYS.event_log("j"))) == 1


def test_a_fenced_run_writes_nothing_more_to_the_log(store: JobStore) -> None:
    """A run that lost its job writes neither its new events nor, as it lets go, the
    ones only in its tail: the claim that fenced it moved those itself, and the new run
    may already have written the same seqs (a stale move would take their place).
    (Before runs were fenced, the fenced run moved its tail events into the log.)"""
    job = _job("j")
    _own(store, job)
    fenced: list[str] = []
    publisher = _publisher(store, fenced)
    for i in range(3):
        publisher._process([EventItem(job, _tokens([i]))])
    assert _log(store.redis, "j") == []
    taken_over(store, "j", "the-new-owner")
    publisher._process([EventItem(job, _tokens([3]))])
    assert fenced == ["j"]
    publisher._process([DoneItem(job, Outcome.FENCED)])
    assert _log(store.redis, "j") == []
    assert not store.move_to_log("j", [b"\x81\xa1x\x01"], 7)


def test_a_takeover_moves_what_the_dead_owner_left_in_its_tail(store: JobStore,
                                                                clean_redis_url: str) -> None:
    job = _job("j")
    store.redis.hset(KEYS.job_record("j"), "state", "running")
    _own(store, job)
    publisher = _publisher(store)
    for step in range(5):
        publisher._process([EventItem(job, _tokens([10 + step]))])
    store.redis.delete(KEYS.lease("j"))  # the owner died
    settings = WorkerSettings(redis_url=clean_redis_url, model_name="m")
    successor = JobStore(store.redis, settings)
    claim = successor.claim("j", "{}", "digest")
    assert claim.status == "claimed"
    assert claim.progress is not None
    assert claim.progress.next_seq == 5
    assert claim.progress.tokens == {0: [10, 11, 12, 13, 14]}
    [(last, events)] = _log(store.redis, "j")
    assert (last, len(events)) == (4, 5)
    # The claim raised the dead owner's fence flag: should it wake up, its batch for the
    # job writes nothing, and its other jobs are checked one by one.
    assert store.redis.ttl(KEYS.worker_fenced(store.worker_id)) > 6 * 86_400
    assert not store.redis.exists(KEYS.worker_fenced(successor.worker_id))
    fenced: list[str] = []
    _publisher(store, fenced)._process([EventItem(job, _tokens([99]))])
    assert fenced == ["j"]
    assert len(_log(store.redis, "j")) == 1
    # A job nobody holds gets its last event after the tail's (the watchdog's failure).
    other = _job("k")
    store.redis.hset(KEYS.job_record("k"), "state", "running")
    _own(store, other)
    publisher._process([EventItem(other, _tokens([1])), EventItem(other, _tokens([2], 1))])
    store.redis.delete(KEYS.lease("k"))
    assert successor.append_unowned("k", Finished(seq=0, finish_reason="stop")) == 2
    assert [e.seq for e in _everything(clean_redis_url, "k")] == [0, 1, 2]  # type: ignore[attr-defined]


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
    _own(store, *jobs)
    publisher = _publisher(store)
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
            _wait_until(lambda job=job: _tokens_written(clean_redis_url, job.job_id) == 10)
            events = _everything(clean_redis_url, job.job_id)
            # Two round trips at most: the one held, then everything queued behind it.
            assert [e.seq for e in events] == [0, 1]  # type: ignore[attr-defined]
            merged = [t for e in events for t in e.token_ids]  # type: ignore[attr-defined]
            assert merged == list(range(10))
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        publisher.stop()


def _tokens_written(url: str, job_id: str) -> int:
    return sum(len(e.token_ids) for e in _everything(url, job_id) if isinstance(e, Tokens))


def _wait_until(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

