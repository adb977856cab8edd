"""An ended job leaves an end mark that outlives its record, so a late copy never runs.

Against a real Redis, through the worker's own job store and the SDK's reserve: every way
a job ends (its own batch, its release, an unowned ending, an ending written again after
an outage) sets ``Keyspace.end_mark`` (in a tenant's namespace too), and a copy of its
message claimed after the record and log expired is answered ``done``. Before, the
record was the only trace: once it expired with the log (``KVRELAY_LOG_TTL``), the copy
was claimed as attempt 1 with an empty log and the job ran a second time (chaos seed
10055: a copy restored at a reconnect reached a worker woken from a stall). A new request
under the id (the SDK's reserve) takes the mark away and runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from kvrelay import event_log
from kvrelay.job_script_helpers import END_MARK_TTL_S
from kvrelay.job_scripts import RESERVE
from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Tokens, encode_event
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.settings import WorkerSettings


@pytest.fixture
def client(clean_redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(clean_redis_url) as connection:
        yield connection


def _store(client: redis.Redis, url: str, namespace: str = "") -> JobStore:
    return JobStore(client, WorkerSettings(redis_url=url, model_name="m", worker_id="w1",
                                           lease_ttl=5.0, namespace=namespace))


def _ended_in_batch(store: JobStore, job_id: str, run: str) -> None:
    events = [encode_event(Tokens(seq=0, token_ids=[1], text="x")),
              encode_event(Finished(seq=1, finish_reason="length"))]
    store.append_batch([JobEvents(job_id, events=[(0, False, events[0]), (1, True, events[1])],
                                  moved=events, moved_last=1, expiry_s=60, release=True,
                                  run=run)])


def _ended_by_release(store: JobStore, job_id: str, run: str) -> None:
    assert store.release_done(job_id, run)


def _ended_unowned(store: JobStore, job_id: str, run: str) -> None:
    store.fail_unclaimed(job_id, "cancelled", "cancelled by its caller")


def _ended_again(store: JobStore, job_id: str, run: str) -> None:
    store.redis.delete(store.keys.job_record(job_id))  # the outage lost the release
    assert store.reassert_end(job_id, run, lost=True) == 1


ENDINGS: dict[str, Callable[[JobStore, str, str], None]] = {
    "its own batch": _ended_in_batch, "its release": _ended_by_release,
    "an unowned ending": _ended_unowned, "written again after an outage": _ended_again,
}


@pytest.mark.parametrize("namespace", ["", "tenant-a"])
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_late_copy_of_an_ended_job_is_dropped_after_its_record_expired(
        client: redis.Redis, clean_redis_url: str, ending: str, namespace: str) -> None:
    store = _store(client, clean_redis_url, namespace)
    keys = Keyspace(namespace)
    assert store.claim("j", "{}", "d", "w1#a").status == "claimed"
    ENDINGS[ending](store, "j", "w1#a")
    mark_ttl = client.ttl(keys.end_mark("j"))
    assert END_MARK_TTL_S - 5 <= mark_ttl <= END_MARK_TTL_S, (ending, mark_ttl)
    assert client.get(keys.end_mark("j")) == b"1"  # the id alone: nothing of the request
    # The record and the log expire with KVRELAY_LOG_TTL; the mark is left.
    client.delete(keys.job_record("j"), keys.event_log("j"))
    late = store.claim("j", "{}", "d", "w2#b")
    assert late.status == "done", (ending, late)
    assert not client.exists(keys.job_record("j"), keys.event_log("j"), keys.lease("j"))


def test_a_new_request_under_an_ended_id_takes_the_mark_away_and_runs(
        client: redis.Redis, clean_redis_url: str) -> None:
    store = _store(client, clean_redis_url)
    keys = Keyspace()
    assert store.claim("j", "{}", "d", "w1#a").status == "claimed"
    assert store.release_done("j", "w1#a")
    client.delete(keys.job_record("j"), keys.event_log("j"))  # expired
    # The SDK's reserve, as ``JobLifecycle.reserve`` sends it, for a new request.
    created, _ = store.scripts.call(RESERVE, [keys.job_record("j")],
                                    [event_log.DIGEST_FIELD, "d2", event_log.LIVE_LOG_TTL_S])
    assert created == 1
    assert not client.exists(keys.end_mark("j"))
    claim = store.claim("j", "{}", "d2", "w1#c")
    assert (claim.status, claim.attempt) == ("claimed", 1)
