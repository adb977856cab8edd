"""500 malformed jobs through the real queue: each ends in a typed failure, the worker lives.

Random bytes and strings, wrong JSON types, missing or mistyped fields, a prompt over the
payload limit, a prompt over the context length, an unknown model, invalid sampling
values, a future protocol version, extra task arguments, a lone surrogate, deep nesting. Every job gets exactly one
``Failed`` event with the stable code its defect calls for; a good job afterwards works.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from helpers.bad_payloads import LONE_SURROGATE, nested_stop_json
from helpers.celery_send import send_raw
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay import Client
from kvrelay.protocol import Failed, Started, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"


def _good(job_id: str, **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"job_id": job_id, "model": MODEL, "prompt_token_ids": [1, 2, 3],
                               "sampling": {"max_tokens": 4}}
    payload.update(changes)
    return payload


def _sampling(job_id: str, **sampling: Any) -> dict[str, Any]:
    return _good(job_id, sampling={"max_tokens": 4, **sampling})


# Each maker returns (args, kwargs, expected code) for a fresh job id.
Maker = Callable[[str, random.Random], tuple[list[Any], dict[str, Any], str]]

MAKERS: list[Maker] = [
    lambda j, r: ([r.randbytes(r.randrange(1, 200))], {}, "invalid_request"),
    lambda j, r: (["".join(chr(r.randrange(32, 0x2FFF)) for _ in range(50))], {},
                  "invalid_request"),
    lambda j, r: ([r.choice([0, 1.5, True, None, [], [1, 2], "{}", "[]"])], {},
                  "invalid_request"),
    lambda j, r: ([{"job_id": j}], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt_token_ids="abc")], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt_token_ids=[-5])], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt_token_ids=[10**9])], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt_token_ids=[])], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt="hi")], {}, "invalid_request"),  # prompt and ids both
    lambda j, r: ([_good(j, prompt="")], {}, "invalid_request"),
    lambda j, r: ([_good(j, messages=[{"role": "wizard", "content": "x"}],
                         prompt_token_ids=None)], {}, "invalid_request"),
    lambda j, r: ([{**_good(j), "job_id": "someone-else"}], {}, "invalid_request"),
    lambda j, r: ([_good(j, prompt="x" * (2 << 20), prompt_token_ids=None)], {},
                  "payload_too_large"),
    lambda j, r: ([_good(j, prompt_token_ids=[7] * 5000)], {}, "prompt_too_long"),
    lambda j, r: ([_good(j, model="no-such-model")], {}, "unknown_model"),
    lambda j, r: ([_good(j, protocol_major=99)], {}, "protocol_version"),
    lambda j, r: ([_sampling(j, temperature=-1.0)], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, top_p=2.0)], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, max_tokens=-3)], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, n=0)], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, logprobs=1000)], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, stop=[""])], {}, "invalid_request"),
    lambda j, r: ([_sampling(j, top_k="many")], {}, "invalid_request"),
    lambda j, r: ([_good(j)], {"surprise": 1}, "invalid_request"),
    lambda j, r: ([_good(j), "extra"], {}, "invalid_request"),
    # Defects that blow up while decoding (an uncaught error used to end the task silently).
    lambda j, r: ([_good(j, prompt=f"hi {LONE_SURROGATE}", prompt_token_ids=None)], {}, "invalid_request"),
    lambda j, r: ([nested_stop_json(j, MODEL, r.choice([900, 5000]))], {}, "invalid_request"),
]


def test_500_malformed_jobs_fail_cleanly(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    worker = start_worker("fuzzed", concurrency=8)
    rng = random.Random(1234)
    expected: dict[str, str] = {}
    tasks = []
    for i in range(500):
        job_id = uuid.uuid4().hex
        args, kwargs, code = MAKERS[i % len(MAKERS)](job_id, rng)
        tasks.append((job_id, args, kwargs))
        expected[job_id] = code
    send_raw(clean_redis_url, MODEL, tasks)
    deadline = time.monotonic() + 180
    for job_id, code in expected.items():
        events = wait_terminal(clean_redis_url, job_id, timeout=max(1.0, deadline - time.monotonic()))
        assert len(events) == 1, events
        failed = events[0]
        assert isinstance(failed, Failed)
        assert failed.code == code, (failed, code)
        assert failed.message
    assert worker.alive()
    with Client(clean_redis_url, model=MODEL) as client:
        done = client.generate(prompt_token_ids=[5, 6, 7], max_tokens=8, temperature=0.0,
                               ignore_eos=True)
    assert len(done.token_ids) == 8
    assert done.finish_reason == "length"


def test_no_started_or_tokens_for_rejected_jobs(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    """A rejected job reveals nothing but its failure (no Started, no Tokens)."""
    start_worker("strict", concurrency=2)
    job_id = uuid.uuid4().hex
    send_raw(clean_redis_url, MODEL, [(job_id, [_sampling(job_id, top_p=5.0)], {})])
    events = wait_terminal(clean_redis_url, job_id)
    assert not any(isinstance(e, (Started, Tokens)) for e in events)
