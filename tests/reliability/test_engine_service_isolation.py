"""The worker's engine thread: a job that breaks a step gets ``Failed``, the rest go on.

The real ``EngineService`` runs a real engine on a tiny model; only the publisher is
replaced by a list that records what would go to Redis (the Redis side has its own
tests). The hostile job's options are changed after admission, so the failure happens
inside ``step()``. Before failure isolation, every job the service held got ``Failed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from helpers.engine_run import one_torch_thread
from helpers.recording_publisher import RecordingPublisher

from kvrelay.protocol import ErrorCode, Failed, Finished, GenerateRequest, Tokens
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.jobs.active_job import ActiveJob, Outcome
from kvrelay_worker.jobs.job_store import PriorProgress
from kvrelay_worker.jobs.publisher import EventItem, Publisher
from kvrelay_worker.metrics import WorkerMetrics


def make_job(job_id: str, prompt: list[int], params: SamplingParams) -> ActiveJob:
    request = GenerateRequest(job_id=job_id, model="tiny", prompt_token_ids=prompt)
    return ActiveJob(job_id=job_id, request=request, payload_json="", params=params,
                     prompt_ids=prompt, attempt=1, prior=PriorProgress())


def tokens(publisher: RecordingPublisher, job_id: str) -> list[int]:
    return [t for e in publisher.events(job_id) if isinstance(e, Tokens) for t in e.token_ids]


def test_one_job_fails_and_the_others_keep_going(tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model("llama-mqa"))
    publisher = RecordingPublisher()
    with one_torch_thread():
        service = EngineService(
            lambda: LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
                        max_model_len=256).engine,
            cast(Publisher, publisher), WorkerMetrics("tiny"))
        service.start()
        try:
            greedy = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
            service.submit(make_job("alone", [5, 6, 7, 8], greedy))
            assert isinstance(publisher.wait_terminal("alone"), Finished)

            hostile = SamplingParams(temperature=1.0, max_tokens=60, ignore_eos=True)
            service.submit(make_job("hostile", [9, 10, 11], hostile))
            for i in range(3):
                service.submit(make_job(f"long-{i}", [5 + i, 6, 7, 8, i], greedy))
            service.submit(make_job("long-same", [5, 6, 7, 8], greedy))
            deadline = time.monotonic() + 60
            while not tokens(publisher, "hostile"):
                assert time.monotonic() < deadline
                time.sleep(0.005)
            hostile.top_k = 2**63  # the int64 top-k tensor can no longer be built

            failed = publisher.wait_terminal("hostile")
            assert isinstance(failed, Failed)
            assert failed.code == ErrorCode.INTERNAL
            assert "failed on this request" in failed.message
            outcomes = [i.outcome for i in publisher.items
                        if isinstance(i, EventItem) and i.job.job_id == "hostile"]
            assert outcomes[-1] == Outcome.FAILED
            for i in range(3):
                assert isinstance(publisher.wait_terminal(f"long-{i}"), Finished)
                assert len(tokens(publisher, f"long-{i}")) == 60
            assert isinstance(publisher.wait_terminal("long-same"), Finished)
            assert tokens(publisher, "long-same") == tokens(publisher, "alone")

            service.submit(make_job("after", [5, 6, 7, 8], greedy))
            assert isinstance(publisher.wait_terminal("after"), Finished)
            assert tokens(publisher, "after") == tokens(publisher, "alone")
            deadline = time.monotonic() + 10
            stats = service.stats()
            while stats["free_blocks"] != stats["total_blocks"]:
                assert time.monotonic() < deadline, f"KV blocks leaked: {stats}"
                time.sleep(0.01)
                stats = service.stats()
            assert stats["jobs"] == 0
        finally:
            service.stop()
