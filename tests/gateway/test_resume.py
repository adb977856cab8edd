"""A stream cut after a few events resumes on another gateway process with Last-Event-ID:
exactly the remaining events, no gap, no duplicate; also with the worker SIGKILLed between.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.job_log import read_events
from helpers.sse_client import events, token_ids
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import Started, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
REQUEST = {"model": MODEL, "prompt": [21, 22, 23], "max_tokens": 300, "temperature": 0,
           "ignore_eos": True, "logprobs": 0, "stream": True, "resumable": True,
           "return_tokens_as_token_ids": True}  # logprob tokens name their ids


@pytest.fixture
def two_gateways(clean_redis_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    first = GatewayProcess(clean_redis_url, tmp_path, "gateway-a").start()
    second = GatewayProcess(clean_redis_url, tmp_path, "gateway-b").start()
    try:
        yield first.url, second.url
    finally:
        first.stop()
        second.stop()


def whole_stream(url: str, headers: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    with httpx.stream("POST", f"{url}/v1/completions", json=REQUEST, headers=headers,
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        return list(events(response))


def cut_after(url: str, count: int) -> list[tuple[str, Any]]:
    """Read ``count`` events, then drop the connection."""
    got: list[tuple[str, Any]] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=REQUEST, timeout=120) as response:
        assert response.status_code == 200
        for event in events(response):
            got.append(event)
            if len(got) == count:
                break
    return got


def check_resumed(redis_url: str, first: list[tuple[str, Any]], rest: list[tuple[str, Any]],
                  reference: list[tuple[str, Any]]) -> None:
    job = first[0][0].rpartition(":")[0]
    seqs = [int(i.rpartition(":")[2]) for i, _ in first + rest]
    assert all(i.rpartition(":")[0] == job for i, _ in first + rest)
    token_seqs = seqs[:-2]  # the finish chunk and [DONE] share the Finished event's seq
    assert token_seqs == sorted(set(token_seqs))
    # Every Tokens event of the job's log, once, in order (a Started event of a takeover
    # takes a seq of its own but is no SSE event).
    log = read_events(redis_url, job)
    assert token_seqs == [e.seq for e in log if isinstance(e, Tokens)]
    assert seqs[-1] == log[-1].seq  # the finish chunk and [DONE] carry the Finished seq
    got = [t for _, data in first + rest if data != "[DONE]" for t in token_ids(data)]
    want = [t for _, data in reference if data != "[DONE]" for t in token_ids(data)]
    assert got == want
    assert len(got) == 300
    assert rest[-1][1] == "[DONE]"
    assert rest[-2][1]["choices"][0]["finish_reason"] == "length"


def test_resume_on_a_second_gateway(start_worker: Callable[..., WorkerProcess],
                                    clean_redis_url: str,
                                    two_gateways: tuple[str, str]) -> None:
    start_worker(concurrency=2)
    first_url, second_url = two_gateways
    reference = whole_stream(first_url)
    first = cut_after(first_url, 5)
    with httpx.stream("POST", f"{second_url}/v1/completions", json=REQUEST, timeout=120,
                      headers={"Last-Event-ID": first[-1][0]}) as response:
        assert response.status_code == 200
        rest = list(events(response))
    check_resumed(clean_redis_url, first, rest, reference)


def test_resume_after_the_worker_was_killed(start_worker: Callable[..., WorkerProcess],
                                            clean_redis_url: str,
                                            two_gateways: tuple[str, str]) -> None:
    workers = [start_worker("a", concurrency=2), start_worker("b", concurrency=2)]
    first_url, second_url = two_gateways
    reference = whole_stream(first_url)
    first = cut_after(first_url, 5)
    job = first[0][0].rpartition(":")[0]
    started = [e for e in read_events(clean_redis_url, job) if isinstance(e, Started)][-1]
    pid = int(started.worker.rsplit(":", 1)[1])
    victim = next(w for w in workers if w.pid == pid)
    victim.kill()
    deadline = time.monotonic() + 60
    while sum(isinstance(e, Started) for e in read_events(clean_redis_url, job)) < 2:
        assert time.monotonic() < deadline, "no worker took the job over"
        time.sleep(0.05)
    with httpx.stream("POST", f"{second_url}/v1/completions", json=REQUEST, timeout=120,
                      headers={"Last-Event-ID": first[-1][0]}) as response:
        assert response.status_code == 200
        rest = list(events(response))
    check_resumed(clean_redis_url, first, rest, reference)
