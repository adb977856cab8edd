"""A worker killed mid-answer: another takes the job over and the caller sees one stream.

Two (then three) real workers; the one serving a greedy job is SIGKILLed after a few
tokens. A live worker notices the expired lease, requeues the job, and the new owner
resumes from the tokens already in the job's log: same seq numbering, no token lost or
repeated, and the final text equals an uninterrupted run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import AnyEvent, Finished, Started, Tokens

pytestmark = pytest.mark.integration

JOB = {"prompt_token_ids": [21, 22, 23, 24, 25], "max_tokens": 600, "temperature": 0.0,
       "ignore_eos": True}


def _serving(workers: list[WorkerProcess], events: list[AnyEvent]) -> WorkerProcess:
    started = [e for e in events if isinstance(e, Started)][-1]
    pid = int(started.worker.rsplit(":", 1)[1])
    return next(w for w in workers if w.pid == pid)


def _tokens(events: list[AnyEvent]) -> list[int]:
    return [t for e in events if isinstance(e, Tokens) for t in e.token_ids]


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    raise TimeoutError(what)


def _reference(url: str) -> tuple[str, list[int]]:
    with Client(url, model="llama-mqa") as client:
        done = client.generate(**JOB)
    return done.text, done.token_ids


def _kill_while_serving(url: str, workers: list[WorkerProcess], client: Client,
                        kills: int) -> tuple[list[int], str, list[int], list[float], str]:
    """Stream the job, SIGKILL its worker ``kills`` times; return what the caller saw."""
    seqs: list[int] = []
    texts: list[str] = []
    takeovers: list[float] = []
    with client.stream(**JOB) as stream:
        job_id = stream.job_id
        killed = 0
        kill_at = 5
        for chunk in stream:
            seqs.append(chunk.seq)
            texts.append(chunk.text)
            received = sum(1 for _ in seqs)
            if killed < kills and received >= kill_at:
                events = read_events(url, job_id)
                victim = _serving(workers, events)
                attempts_before = sum(isinstance(e, Started) for e in events)
                victim.kill()
                t0 = time.monotonic()
                takeovers.append(_wait_for(
                    lambda n=attempts_before: sum(
                        isinstance(e, Started) for e in read_events(url, job_id)) > n,
                    30, "no worker took the job over"))
                del t0
                killed += 1
                kill_at = received + 5
        final = stream.final()
    return seqs, "".join(texts), final.token_ids, takeovers, job_id


def test_job_survives_its_worker_being_killed(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    workers = [start_worker("a", concurrency=4), start_worker("b", concurrency=4)]
    ref_text, ref_tokens = _reference(clean_redis_url)
    with Client(clean_redis_url, model="llama-mqa") as client:
        seqs, text, tokens, takeovers, job_id = _kill_while_serving(
            clean_redis_url, workers, client, kills=1)
    assert takeovers[0] < 10.0, f"takeover took {takeovers[0]:.1f}s"
    events = wait_terminal(clean_redis_url, job_id)
    assert [e.seq for e in events] == list(range(len(events)))  # the log has no gap
    assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]
    assert isinstance(events[-1], Finished)
    assert _tokens(events) == ref_tokens  # nothing repeated, nothing missing
    assert tokens == ref_tokens
    assert text == ref_text
    assert seqs == sorted(set(seqs))  # the caller saw each event once, in order


def test_job_survives_two_worker_deaths(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    workers = [start_worker(n, concurrency=4) for n in ("a", "b", "c")]
    ref_text, ref_tokens = _reference(clean_redis_url)
    with Client(clean_redis_url, model="llama-mqa") as client:
        _, text, tokens, takeovers, job_id = _kill_while_serving(
            clean_redis_url, workers, client, kills=2)
    assert all(t < 10.0 for t in takeovers), takeovers
    events = wait_terminal(clean_redis_url, job_id)
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2, 3]
    assert sum(w.alive() for w in workers) == 1
    assert tokens == ref_tokens
    assert text == ref_text
