"""best_of through the worker: the winners arrive as ordinary choices 0..n-1, all at once.

Through the queue with a real worker process (``generate`` and ``stream`` agree, and the
answer is the most likely of the candidates its seeded n=best_of twin shows), and the
engine thread with a recording publisher for a resume after a partial publication: the
job restarts from its prompt and sends only the winners not already in its log.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from helpers.engine_run import one_torch_thread
from helpers.recording_publisher import RecordingPublisher
from helpers.worker_process import WorkerProcess

from kvrelay import Client, InvalidRequest
from kvrelay.completion import Choice
from kvrelay.protocol import Finished, GenerateRequest, Tokens
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.jobs.active_job import ActiveJob
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.publisher import Publisher
from kvrelay_worker.metrics import WorkerMetrics

PROMPT = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]
SAMPLED: dict[str, Any] = {"prompt_token_ids": PROMPT, "max_tokens": 8, "temperature": 1.0,
                           "seed": 5, "ignore_eos": True}


def score(choice: Choice) -> float:
    assert choice.logprobs is not None
    return math.fsum(entry.logprob for entry in choice.logprobs)


@pytest.mark.integration
def test_generate_and_stream_return_the_best_candidate(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    start_worker("best", concurrency=4)
    with Client(clean_redis_url, model="llama-mqa") as client:
        with pytest.raises(InvalidRequest, match=r"best_of \(1\) must be at least n \(2\)"):
            client.generate(n=2, best_of=1, **SAMPLED)
        twin = client.generate(n=3, logprobs=0, **SAMPLED)
        done = client.generate(n=1, best_of=3, **SAMPLED)
        with client.stream(n=1, best_of=3, **SAMPLED) as stream:
            chunks = list(stream)
            streamed = stream.final()
    (best,) = done.choices
    scores = [score(c) for c in twin.choices]
    assert best.token_ids == twin.choices[scores.index(max(scores))].token_ids
    # The twin ran first, so this job's prompt came from the prefix cache: logits (not
    # tokens) differ in the last float bits.
    assert best.cumulative_logprob == pytest.approx(max(scores), rel=1e-4)
    assert done.usage.completion_tokens == 3 * SAMPLED["max_tokens"]
    # The stream holds the winner whole, in one chunk, and agrees with generate.
    assert [(c.index, c.text, c.token_ids) for c in chunks] == [(0, best.text, best.token_ids)]
    assert streamed.text == done.text
    assert streamed.choices[0].cumulative_logprob == pytest.approx(best.cumulative_logprob,
                                                                   rel=1e-4)


# ------------------------------------------------------------ resume (engine thread)


def submit(service: EngineService, job_id: str, params: SamplingParams,
           prior: PriorProgress) -> None:
    request = GenerateRequest(job_id=job_id, model="tiny", prompt_token_ids=PROMPT)
    service.submit(ActiveJob(job_id=job_id, request=request, payload_json="", params=params,
                             prompt_ids=PROMPT, attempt=2 if prior.next_seq else 1,
                             prior=prior, next_seq=prior.next_seq))


def test_a_partly_published_best_of_job_restarts_and_sends_only_the_rest(
        tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model("llama-mqa"))
    publisher = RecordingPublisher()
    params = SamplingParams(n=2, best_of=4, max_tokens=6, temperature=1.0, seed=9,
                            ignore_eos=True)
    with one_torch_thread():
        service = EngineService(
            lambda: LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
                        max_model_len=256).engine,
            cast(Publisher, publisher), WorkerMetrics("tiny"))
        service.start()
        try:
            submit(service, "whole", params, PriorProgress())
            whole = publisher.wait_events("whole")
            # An earlier attempt published winner 0 (whole, as always), then died.
            first = whole[0]
            prior = PriorProgress(next_seq=2, tokens={0: list(first.token_ids)},
                                  texts={0: [first.text]}, finish_reasons={0: "stop"})
            submit(service, "resumed", params, prior)
            resumed = publisher.wait_events("resumed")
        finally:
            service.stop()
    assert [(e.index, e.finish_reason) for e in whole[:2]] == [(0, "length"), (1, "length")]
    assert isinstance(whole[2], Finished)
    # Only winner 1 is sent again: the same one (the request is seeded), never candidate
    # tokens glued onto winner 0's.
    tokens, finished = resumed
    assert isinstance(tokens, Tokens)
    assert (tokens.index, tokens.token_ids, tokens.text) == (
        1, whole[1].token_ids, whole[1].text)
    assert tokens.cumulative_logprob == pytest.approx(whole[1].cumulative_logprob, rel=1e-4)
    assert isinstance(finished, Finished)
    assert finished.finish_reasons == ["stop", "length"]  # the log's reason for winner 0
