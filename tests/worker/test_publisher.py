"""The publisher against a real Redis: fencing, merging token events, scripts by SHA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from helpers.job_log import read_events
from helpers.takeover import taken_over

from kvrelay.keys import Keyspace
from kvrelay.protocol import Failed, Finished, GenerateRequest, Tokens, ToolCallDelta, Usage
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import JobStore, PriorProgress
from kvrelay_worker.jobs.publisher import DoneItem, EventItem, Item, Publisher, coalesce
from kvrelay_worker.metrics import WorkerMetrics
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()  # the default namespace


@pytest.fixture
def store(clean_redis_url: str) -> Iterator[JobStore]:
    client = redis.Redis.from_url(clean_redis_url)
    yield JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m"))
    client.close()


def _job(job_id: str) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="m", prompt_token_ids=[1, 2])
    return ActiveJob(job_id=job_id, request=request, payload_json="{}",
                     params=SamplingParams(max_tokens=4), prompt_ids=[1, 2], attempt=1,
                     prior=PriorProgress())


def _tokens(ids: list[int], index: int = 0, finish: str | None = None) -> Tokens:
    return Tokens(seq=0, token_ids=ids, text="".join(f"<{i}>" for i in ids), index=index,
                  finish_reason=finish)


def _finished() -> Finished:
    return Finished(seq=0, finish_reason="length", finish_reasons=["length"],
                    usage=Usage(prompt_tokens=2, completion_tokens=3, cached_tokens=0))


def _publisher(store: JobStore, fenced: list[str]) -> Publisher:
    return Publisher(store, WorkerMetrics("m"), requeue=lambda job_id, payload: None,
                     on_fenced=lambda job: fenced.append(job.job_id))


def _log(store: JobStore, job_id: str) -> list[tuple[int, object]]:
    """(seq, event) of every event a reader finds (the log, then the worker's tail)."""
    url = store.settings.redis_url
    return [(event.seq, event) for event in read_events(url, job_id)]


def _own(store: JobStore, job_id: str) -> None:
    """Hold the job's lease and name this worker its owner, as a claim does."""
    store.redis.set(KEYS.lease(job_id), store.worker_id)
    store.redis.hset(KEYS.job_record(job_id), mapping={"owner": store.worker_id,
                                                       "run": store.worker_id})


def test_coalesce_merges_a_jobs_consecutive_tokens_of_one_choice() -> None:
    a, b = _job("a"), _job("b")
    items: list[Item] = [
        EventItem(a, _tokens([1])), EventItem(b, _tokens([7])), EventItem(a, _tokens([2])),
        EventItem(a, _tokens([3], index=1)), EventItem(a, _tokens([4], index=1, finish="stop")),
        EventItem(a, _tokens([5], index=1)), DoneItem(b, Outcome.FENCED),
        EventItem(b, _tokens([8])),
    ]
    out = coalesce(items)
    summary = [(i.job.job_id, i.event.index, i.event.token_ids, i.event.finish_reason)
               if isinstance(i, EventItem) and isinstance(i.event, Tokens)
               else (i.job.job_id, type(i).__name__) for i in out]
    assert summary == [
        ("a", 0, [1, 2], None),
        ("b", 0, [7], None),
        ("a", 1, [3, 4], "stop"),  # a finished choice takes nothing more
        ("a", 1, [5], None),
        ("b", "DoneItem"),  # nothing merges across another item of the same job
        ("b", 0, [8], None),
    ]
    assert out[0].event.text == "<1><2>"  # type: ignore[union-attr]


def test_coalesce_keeps_reasoning_call_pieces_and_prompt_logprobs() -> None:
    """Steps merged into one event carry every step's reasoning and call arguments (a
    speculative step or a slow round merges several): nothing of a tool call is lost."""
    job = _job("a")
    first = _tokens([1])
    first.reasoning = "think"
    first.prompt_logprobs = [None]
    second = _tokens([2])
    second.reasoning = "ing"
    second.tool_calls = [ToolCallDelta(index=0, id="call_1", name="f", arguments='{"a"')]
    third = _tokens([3, 4])
    third.tool_calls = [ToolCallDelta(index=0, arguments=": 1"),
                        ToolCallDelta(index=0, arguments="}"),
                        ToolCallDelta(index=1, id="call_2", name="g", arguments="{}")]
    out = coalesce([EventItem(job, first), EventItem(job, second), EventItem(job, third)])
    (merged,) = [i.event for i in out if isinstance(i, EventItem)]
    assert isinstance(merged, Tokens)
    assert merged.token_ids == [1, 2, 3, 4]
    assert merged.reasoning == "thinking"
    assert merged.prompt_logprobs == [None]
    assert merged.tool_calls == [
        ToolCallDelta(index=0, id="call_1", name="f", arguments='{"a": 1}'),
        ToolCallDelta(index=1, id="call_2", name="g", arguments="{}")]


def test_events_are_numbered_written_and_published_in_order(store: JobStore) -> None:
    job = _job("j1")
    _own(store, job.job_id)
    publisher = _publisher(store, [])
    publisher._process([EventItem(job, _tokens([1, 2])), EventItem(job, _tokens([3])),
                        EventItem(job, _finished(), Outcome.FINISHED)])
    log = _log(store, job.job_id)
    assert [seq for seq, _ in log] == [0, 1, 2]
    assert [e.token_ids for _, e in log[:2]] == [[1, 2], [3]]  # type: ignore[attr-defined]
    assert isinstance(log[2][1], Finished)
    assert job.done.is_set()
    assert job.outcome == Outcome.FINISHED


def test_a_fenced_terminal_event_still_ends_the_task(store: JobStore) -> None:
    """Another worker owns the job now: nothing is written, and the task thread waiting on
    the job wakes up (the engine has already let go of it, so no abort can end it)."""
    job = _job("j2")
    taken_over(store, job.job_id)
    fenced: list[str] = []
    publisher = _publisher(store, fenced)
    publisher._process([EventItem(job, Failed(seq=0, code="internal", message="x"),
                                  Outcome.FAILED)])
    assert job.done.is_set()
    assert job.outcome == Outcome.FENCED
    assert fenced == []
    assert _log(store, job.job_id) == []


def test_a_fenced_token_event_stops_the_job_in_the_engine(store: JobStore) -> None:
    job = _job("j3")
    taken_over(store, job.job_id)
    fenced: list[str] = []
    _publisher(store, fenced)._process([EventItem(job, _tokens([1]))])
    assert fenced == ["j3"]
    assert not job.done.is_set()  # its end comes from the engine, as a DoneItem


def test_scripts_are_loaded_again_after_a_script_flush(store: JobStore) -> None:
    """Batches run scripts by SHA alone; a server that lost them (restart) gets them again."""
    job = _job("j4")
    _own(store, job.job_id)
    store.redis.script_flush()
    _publisher(store, [])._process([EventItem(job, _tokens([9]))])
    assert [(seq, e.token_ids) for seq, e in _log(store, job.job_id)] == [(0, [9])]  # type: ignore[attr-defined]
    store.redis.script_flush()
    assert store.refresh_leases([job.job_id]) == ([], [])


def _script_exists_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


def test_a_batch_is_one_round_trip_without_script_exists(store: JobStore) -> None:
    """redis-py would ask SCRIPT EXISTS before a pipeline holding scripts: a second trip."""
    job = _job("j5")
    _own(store, job.job_id)
    publisher = _publisher(store, [])
    publisher._process([EventItem(job, _tokens([1]))])  # the script is loaded now
    before = _script_exists_calls(store.redis)
    publisher._process([EventItem(job, _tokens([2])), EventItem(job, _tokens([3], index=1))])
    store.refresh_leases([job.job_id])
    assert _script_exists_calls(store.redis) == before
    assert [seq for seq, _ in _log(store, job.job_id)] == [0, 1, 2]
