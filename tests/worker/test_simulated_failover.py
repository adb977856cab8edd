"""Simulated workers keep the real lease machinery: one SIGKILLed mid-answer, the other
takes the job over and continues it, and the caller sees one stream equal to an
uninterrupted run (the simulated tokens depend only on the prompt and the position)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.job_log import read_events, wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import Started, Tokens

pytestmark = pytest.mark.integration

JOB = {"prompt": "a question the simulated engine answers", "max_tokens": 150}
FAST = {"model": "simulated", "concurrency": 4, "simulated_step_ms": 20,
        "lease_ttl": 2.0, "lease_refresh": 0.5, "watchdog_interval": 0.5}


def test_a_killed_simulated_worker_s_job_continues_on_the_other(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    workers = [start_worker("sim-a", **FAST), start_worker("sim-b", **FAST)]
    with Client(clean_redis_url, model="simulated") as client:
        reference = client.generate(**JOB)
        seqs: list[int] = []
        text: list[str] = []
        with client.stream(**JOB) as stream:
            for chunk in stream:
                seqs.append(chunk.seq)
                text.append(chunk.text)
                if len(seqs) == 10:
                    events = read_events(clean_redis_url, stream.job_id)
                    started = [e for e in events if isinstance(e, Started)][-1]
                    pid = int(started.worker.rsplit(":", 1)[1])
                    next(w for w in workers if w.pid == pid).kill()
            final = stream.final()
            job_id = stream.job_id
    events = wait_terminal(clean_redis_url, job_id)
    assert [e.seq for e in events] == list(range(len(events)))  # the log has no gap
    started = [e for e in events if isinstance(e, Started)]
    assert [e.attempt for e in started] == [1, 2]
    assert len({e.worker for e in started}) == 2  # it did move
    # The caller saw every token event of both attempts once, in order.
    assert seqs == [e.seq for e in events if isinstance(e, Tokens)]
    assert final.token_ids == reference.token_ids
    assert "".join(text) == final.text == reference.text
    assert final.finish_reason == "length"
