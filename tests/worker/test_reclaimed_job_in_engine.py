"""A job this worker claims again while its earlier run's request is still in the engine.

A worker that stalls past its leases (SIGSTOP, a long pause) may get one of its own jobs
back: the earlier run is fenced and marked done at once, but its request stays in the
engine until a step ends it, under the same id. The new run must start cleanly: before,
the engine refused the id ("already in the engine", so the new run failed as
``internal``), or the earlier run's ``abort`` output, routed by that id, ended the new
run's stream with no tokens (chaos seed 20 under load).

The real ``EngineService`` on a real engine (tiny model); the publisher records events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from helpers.recording_publisher import RecordingPublisher
from helpers.tiny_service import tiny_service

from kvrelay.protocol import Failed, Finished, GenerateRequest, Tokens
from kvrelay_worker.engine import SamplingParams
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.publisher import EventItem

PROMPT = [5, 6, 7, 8]


def _run(run_id: str, max_tokens: int) -> ActiveJob:
    request = GenerateRequest(job_id="again", model="tiny", prompt_token_ids=PROMPT)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return ActiveJob(job_id="again", request=request, payload_json="", params=params,
                     prompt_ids=PROMPT, attempt=1, prior=PriorProgress(), run_id=run_id)


def _events_of(publisher: RecordingPublisher, run: ActiveJob) -> list[object]:
    with publisher.lock:
        return [i.event for i in publisher.items if isinstance(i, EventItem) and i.job is run]


def test_a_job_claimed_again_runs_whole_beside_its_earlier_request(
        tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model("llama-mqa"))
    publisher = RecordingPublisher()
    with tiny_service(folder, publisher) as service:
        earlier, again = _run("w#1", 200), _run("w#2", 40)
        service.submit(earlier, [])
        deadline = time.monotonic() + 60
        while not any(isinstance(e, Tokens) for e in _events_of(publisher, earlier)):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        service.submit(again, [])  # the earlier run's request is still in the engine
        # Its run had not stopped (the new run waits for that a bounded time, then starts
        # anyway): it ends here as fenced, or its task thread would wait for it forever
        # (a Celery slot lost until shutdown; chaos seed 20 under load).
        assert earlier.done.wait(30), "the earlier run's task would wait forever"
        assert earlier.outcome == Outcome.FENCED
        while not any(isinstance(e, (Finished, Failed)) for e in _events_of(publisher, again)):
            assert time.monotonic() < deadline, _events_of(publisher, again)
            time.sleep(0.005)
    events = _events_of(publisher, again)
    end = events[-1]
    assert not isinstance(end, Failed), end
    assert isinstance(end, Finished)
    assert end.finish_reasons == ["length"]
    assert sum(len(e.token_ids) for e in events if isinstance(e, Tokens)) == 40

