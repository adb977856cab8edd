"""What the takeover throttle is told about a delivered copy, read from a real Redis
written by the worker's own scripts: only a job that ran before and that no lease holds
is a resume, sized by the tokens its log holds (every choice's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay.protocol import Finished, Started, Tokens, Usage
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.takeover_admission import resumed_tokens
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(60)

PAYLOAD = '{"prompt": "p"}'


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    yield JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                          worker_id="host:1:abc"))
    client.close()


def run_with_tokens(store: JobStore, job_id: str) -> str:
    """Claim ``job_id`` and write a Started and 5 tokens over two choices; its run id."""
    run = f"{store.worker_id}#1"
    assert store.claim(job_id, PAYLOAD, "digest", run).status == "claimed"
    for event in (Started(seq=0, worker="host:1"),
                  Tokens(seq=1, token_ids=[5, 6, 7], text="abc"),
                  Tokens(seq=2, token_ids=[8, 9], text="de", index=1)):
        assert store.append_event(job_id, event, fenced=run) == event.seq
    return run


def test_a_job_that_never_ran_is_no_resume(store: JobStore) -> None:
    assert resumed_tokens(store, "fresh") is None


def test_a_job_whose_lease_ran_out_is_a_resume(store: JobStore) -> None:
    run_with_tokens(store, "j")
    assert resumed_tokens(store, "j") is None  # its run holds it: a copy would be dropped
    store.redis.delete(store.keys.lease("j"))  # its worker died: the lease ran out
    assert resumed_tokens(store, "j") == 5


def test_a_job_handed_back_is_a_resume(store: JobStore) -> None:
    run = run_with_tokens(store, "j")
    assert store.mark_handback("j", run)
    assert store.release_handback("j", run)  # a draining worker let go of it: queued
    assert resumed_tokens(store, "j") == 5


def test_an_ended_job_is_no_resume(store: JobStore) -> None:
    run = run_with_tokens(store, "done")
    ended = Finished(seq=3, finish_reason="length", usage=Usage(prompt_tokens=1,
                                                                 completion_tokens=5))
    assert store.append_event("done", ended, fenced=run) == 3
    assert store.release_done("done", run)
    store.redis.delete(store.keys.lease("done"))
    assert resumed_tokens(store, "done") is None
