"""Leases name the run, and an outage is not a death.

Against a real Redis, through the worker's own job store and scripts:
- a claim sent again after its reply was lost finds its own lease and stands (before
  runs, it answered ``owned`` to itself and the job waited a lease period);
- a worker that claims a job it is still running from before a stall fences that earlier
  run (before, both runs wrote: the lease only named the worker);
- a lease that ran out while Redis was out of reach is taken back by its run at the next
  refresh, unless another run claimed the job meanwhile (before, the refresh reported it
  lost and the worker stopped a healthy job);
- the failover watch takes nothing over until this worker's writes have gone through for
  a whole lease period.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Tokens, encode_event
from kvrelay_worker.jobs.failover import Failover
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()



@pytest.fixture
def client(clean_redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(clean_redis_url) as connection:
        yield connection


def _store(client: redis.Redis, url: str, worker: str = "w1", lease_ttl: float = 5.0
           ) -> JobStore:
    return JobStore(client, WorkerSettings(redis_url=url, model_name="m", worker_id=worker,
                                           lease_ttl=lease_ttl))


def _event(seq: int) -> bytes:
    return encode_event(Tokens(seq=seq, token_ids=[seq], text="x"))


def _batch(job_id: str, run: str, seq: int) -> JobEvents:
    return JobEvents(job_id, events=[(seq, False, _event(seq))], run=run)


def test_a_claim_sent_again_after_its_reply_was_lost_stands(
        client: redis.Redis, clean_redis_url: str) -> None:
    store = _store(client, clean_redis_url)
    first = store.claim("j", "{}", "d", "w1#a")
    again = store.claim("j", "{}", "d", "w1#a")
    assert (first.status, first.attempt) == ("claimed", 1)
    assert (again.status, again.attempt) == ("claimed", 1)
    assert store.claim("j", "{}", "d", "w1#b").status == "owned"  # another run: owned
    assert client.hget(KEYS.job_record("j"), "attempts") == b"1"


def test_a_worker_that_claims_its_own_stalled_job_fences_the_earlier_run(
        client: redis.Redis, clean_redis_url: str) -> None:
    store = _store(client, clean_redis_url)
    assert store.claim("j", "{}", "d", "w1#old").status == "claimed"
    assert store.append_batch([_batch("j", "w1#old", 0)]) == [1]
    client.delete(KEYS.lease("j"))  # the worker stalled past its lease; the job was requeued
    client.hset(KEYS.job_record("j"), "state", "queued")
    claim = store.claim("j", "{}", "d", "w1#new")
    assert claim.status == "claimed"
    assert claim.attempt == 2
    # The earlier run's next batch is checked (this worker's fence flag is up) and fenced.
    assert store.append_batch([_batch("j", "w1#old", 1)]) == [AppendResult.FENCED]
    assert not store.release_done("j", "w1#old")
    assert not store.move_to_log("j", [_event(1)], 1, "w1#old")
    assert store.append_batch([_batch("j", "w1#new", 1)]) == [1]


def test_a_lease_that_ran_out_during_an_outage_is_taken_back(
        client: redis.Redis, clean_redis_url: str) -> None:
    store = _store(client, clean_redis_url)
    for job in ("kept", "claimed-meanwhile", "requeued"):
        assert store.claim(job, "{}", "d", f"w1#{job}").status == "claimed"
        client.delete(KEYS.lease(job))  # expired while writes were refused
    other = _store(client, clean_redis_url, "w2")
    assert other.claim("claimed-meanwhile", "{}", "d", "w2#x").status == "claimed"
    client.hset(KEYS.job_record("requeued"), "state", "queued")  # a watch requeued it
    lost, aborted = store.refresh_leases(
        ["kept", "claimed-meanwhile", "requeued"],
        ["w1#kept", "w1#claimed-meanwhile", "w1#requeued"])
    assert lost == ["claimed-meanwhile", "requeued"]
    assert aborted == []
    assert client.get(KEYS.lease("kept")) == b"w1#kept"
    assert 4000 < client.pttl(KEYS.lease("kept")) <= 5000
    assert client.get(KEYS.lease("claimed-meanwhile")) == b"w2#x"
    assert not client.exists(KEYS.lease("requeued"))
    # And a batch that comes before the refresh is not fenced for the expired lease.
    client.delete(KEYS.lease("kept"))
    client.set(KEYS.worker_fenced("w1"), "1")  # batches are checked job by job
    assert store.append_batch([_batch("kept", "w1#kept", 0)]) == [1]


def test_the_watch_takes_nothing_over_until_writes_went_through_for_a_lease(
        client: redis.Redis, clean_redis_url: str) -> None:
    owner = _store(client, clean_redis_url, "w1", lease_ttl=2.0)
    assert owner.claim("j", "{}", "d", "w1#a").status == "claimed"
    client.delete(KEYS.lease("j"))
    client.zadd(owner.running_key, {"j": 1})  # its expiry passed long ago
    requeued: list[str] = []
    now = [100.0]
    health = RedisHealth(clock=lambda: now[0])
    watcher = Failover(_store(client, clean_redis_url, "w2", lease_ttl=2.0),
                       WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                      worker_id="w2", lease_ttl=2.0),
                       requeue=lambda job_id, payload: requeued.append(job_id), health=health)
    health.failed()  # w2's own writes were just refused too
    watcher.take_over_expired()
    assert requeued == []
    now[0] += 1.9
    watcher.take_over_expired()
    assert requeued == []
    now[0] += 0.2  # writes went through for a whole lease
    watcher.take_over_expired()
    assert requeued == ["j"]


def test_a_death_counts_even_when_the_copy_is_claimed_before_the_commit(
        client: redis.Redis, clean_redis_url: str) -> None:
    """The requeued copy can reach a worker (and be claimed) before the watch commits the
    requeue; the death still counts toward ``max_attempts``. Only a lease back with the
    run that lost it (taken back after an outage) counts nothing."""
    owner = _store(client, clean_redis_url, "w1")
    watcher = _store(client, clean_redis_url, "w2")
    assert owner.claim("j", "{}", "d", "w1#a").status == "claimed"
    client.delete(KEYS.lease("j"))  # w1 died
    status, _, lost_run = watcher.check_expired("j")
    assert (status, lost_run) == ("requeue", "w1#a")
    assert watcher.claim("j", "{}", "d", "w2#b").status == "claimed"  # the copy, first
    watcher.commit_requeue("j", lost_run)
    assert client.hget(KEYS.job_record("j"), "lost") == b"1"
    assert client.hget(KEYS.job_record("j"), "state") == b"running"  # w2's run goes on
    # Taken back by the run that lost it: no death.
    assert owner.claim("k", "{}", "d", "w1#c").status == "claimed"
    client.delete(KEYS.lease("k"))
    status, _, lost_run = watcher.check_expired("k")
    assert owner.refresh_leases(["k"], ["w1#c"]) == ([], [])
    watcher.commit_requeue("k", lost_run)
    assert client.hget(KEYS.job_record("k"), "lost") is None


def _finished(seq: int) -> bytes:
    return encode_event(Finished(seq=seq, finish_reason="length"))


def test_a_job_that_ends_after_an_outage_is_released(
        client: redis.Redis, clean_redis_url: str) -> None:
    """Its lease ran out while Redis was failing over; the job's last batch (terminal event
    and release) is the first write that gets through. The job is done, not left running
    without a lease for the watch to run again (seen in chaos seed 5, sentinel: a second
    run republished seqs the client already had)."""
    store = _store(client, clean_redis_url)
    for job in ("batched", "alone"):
        assert store.claim(job, "{}", "d", f"w1#{job}").status == "claimed"
        client.delete(KEYS.lease(job))  # expired during the outage
    last = JobEvents("batched", events=[(0, True, _finished(0))], moved=[_finished(0)],
                     release=True, run="w1#batched")
    assert store.append_batch([last]) == [1]
    assert store.release_done("alone", "w1#alone")
    for job in ("batched", "alone"):
        assert client.hget(KEYS.job_record(job), "state") == b"done"
        assert client.zscore(store.running_key, job) is None
    assert store.check_expired("batched")[0] == "gone"
    # Another run's claim since the outage still wins: the old run releases nothing.
    assert store.claim("taken", "{}", "d", "w1#old").status == "claimed"
    client.delete(KEYS.lease("taken"))
    client.hset(KEYS.job_record("taken"), "state", "queued")
    assert _store(client, clean_redis_url, "w2").claim("taken", "{}", "d", "w2#x").status \
        == "claimed"
    assert not store.release_done("taken", "w1#old")
    assert client.hget(KEYS.job_record("taken"), "state") == b"running"


def test_a_copy_of_a_job_whose_log_ended_is_not_run_again(
        client: redis.Redis, clean_redis_url: str) -> None:
    """Whatever left the record running (a release lost with a failed-over primary), a
    log that holds the terminal event means the job ended: its claim answers ``done``."""
    store = _store(client, clean_redis_url)
    assert store.claim("j", "{}", "d", "w1#a").status == "claimed"
    ended = JobEvents("j", events=[(0, True, _finished(0))], moved=[_finished(0)],
                      run="w1#a")
    assert store.append_batch([ended]) == [1]
    client.delete(KEYS.lease("j"))  # its release never landed
    assert _store(client, clean_redis_url, "w2").claim("j", "{}", "d", "w2#b").status == "done"
    assert client.hget(KEYS.job_record("j"), "state") == b"done"
