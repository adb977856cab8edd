"""A dead worker's tail goes with its last job, however that job ends: against a real Redis.

A worker's tail lives as long as a running job's log while it holds events of a job not
yet in the job's log: for a dead worker, until the job's next owner claims it. A job
whose caller cancelled it as its worker died is never claimed again: the pickup finds it
cancelled and ends it unowned. That ending must settle the dead owner's tail as a claim
does (found by the chaos harness's ``cancel_race``: the tail outlived its job by a day).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay.keys import Keyspace
from kvrelay.protocol import ErrorCode, Failed, Tokens, encode_event
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()
LOG_TTL_S = 50
LIVE_TTL_S = 800


@pytest.fixture
def stores(clean_redis_url: str) -> Iterator[tuple[JobStore, JobStore]]:
    client = redis.Redis.from_url(clean_redis_url)
    yield tuple(JobStore(client, WorkerSettings(  # type: ignore[misc]
        redis_url=clean_redis_url, model_name="m", worker_id=f"w{i}", log_ttl=LOG_TTL_S,
        log_live_ttl=LIVE_TTL_S, lease_ttl=600, lease_refresh=1)) for i in range(2))
    client.close()


def _tokens(seq: int) -> bytes:
    return encode_event(Tokens(seq=seq, token_ids=[seq], text="x"))


@pytest.mark.parametrize("ending", ["cancelled at pickup", "out of attempts"])
def test_an_unclaimed_ending_settles_the_dead_owners_tail(
        stores: tuple[JobStore, JobStore], ending: str) -> None:
    dead, live = stores
    client = dead.redis
    assert dead.claim("j", "{}", "d", "w0#a").status == "claimed"
    # Its events are in its tail only, which then lives as long as a running job's log.
    assert dead.append_batch([JobEvents("j", events=[(0, False, _tokens(0))], run="w0#a")],
                             tail_expiry_s=LIVE_TTL_S) == [1]
    tail = KEYS.worker_tail("w0")
    assert client.ttl(tail) > LOG_TTL_S
    client.delete(KEYS.lease("j"))  # w0 died
    if ending == "cancelled at pickup":
        status, _, lost = live.check_expired("j")
        assert status == "requeue"
        live.commit_requeue("j", lost)
        client.set(KEYS.abort_flag("j"), b"1")  # cancelled as its worker died
        assert live.claim("j", "{}", "d", "w1#b").status == "aborted"
        live.fail_unclaimed("j", ErrorCode.CANCELLED, "cancelled")
    else:
        client.hset(KEYS.job_record("j"), "lost", 100)
        status, _, _ = live.check_expired("j")
        assert status == "exhausted"
        live.append_unowned("j", Failed(seq=0, code=ErrorCode.WORKER_LOST, message="lost"))
    # Its events are in its log now, and the tail goes as an ended job's log would.
    assert client.xlen(KEYS.event_log("j")) == 2
    assert 0 < client.ttl(tail) <= LOG_TTL_S

