"""A reused ``job_id``: the same request attaches to its job, another one is refused.

Fails on the code before the fix: the retry was enqueued again (a second run of the job,
its events refused by the log) and a different request under the id got the old answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import kvrelay
from kvrelay import AsyncClient, event_log
from kvrelay.keys import Keyspace
from kvrelay.protocol import ErrorCode

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.timeout(20)


async def test_a_retry_attaches_and_another_request_is_refused(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client: AsyncClient = make_client(stream_timeout=10.0)
    first = await asyncio.wait_for(client.generate("same prompt", job_id="job-7"), 5)
    assert first.text == "Hello"

    # The same request again (as a retry sends it: new timestamps) attaches at once.
    again = await asyncio.wait_for(client.generate("same prompt", job_id="job-7"), 2)
    assert again.text == "Hello"
    assert [r.job_id for r in worker.requests] == ["job-7"]

    with pytest.raises(kvrelay.JobIdReused) as refused:
        await asyncio.wait_for(client.generate("another prompt", job_id="job-7"), 2)
    assert refused.value.code == ErrorCode.JOB_ID_REUSED == "job_id_reused"
    assert isinstance(refused.value, kvrelay.InvalidRequest)
    assert len(worker.requests) == 1
    # Sampling options are part of the request too.
    with pytest.raises(kvrelay.JobIdReused):
        await client.generate("same prompt", job_id="job-7", max_tokens=3)


async def test_a_failed_enqueue_gives_the_job_id_back(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client: AsyncClient = make_client()
    worker.fail_enqueue = kvrelay.BrokerUnavailable("broker down")
    with pytest.raises(kvrelay.BrokerUnavailable):
        await client.generate("p", job_id="job-8")
    assert await fake_redis.hget(KEYS.job_record("job-8"), event_log.DIGEST_FIELD) is None
    worker.fail_enqueue = None
    done = await asyncio.wait_for(client.generate("p", job_id="job-8"), 5)
    assert done.text == "Hello"
    assert [r.job_id for r in worker.requests] == ["job-8"]


def test_both_sides_hash_a_request_alike() -> None:
    from kvrelay.protocol import (
        GenerateRequest,
        SamplingOptions,
        decode_request_json,
        encode_request,
        request_digest,
    )

    # As built by hand (an int where the wire type is a float) and as a worker decodes it.
    sent = GenerateRequest(job_id="j", model="m", prompt="p", enqueued_at=5.0, deadline=9.0,
                           sampling=SamplingOptions(temperature=2, min_p=0))  # type: ignore[arg-type]
    received = decode_request_json(encode_request(sent))
    retried = GenerateRequest(job_id="j", model="m", prompt="p", enqueued_at=7.0,
                              sampling=SamplingOptions(temperature=2.0, min_p=0.0))
    assert request_digest(sent) == request_digest(received) == request_digest(retried)
    other = GenerateRequest(job_id="j", model="m", prompt="q")
    assert request_digest(other) != request_digest(sent)


async def test_a_refused_request_leaves_the_other_job_alone(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client: AsyncClient = make_client()
    await asyncio.wait_for(client.generate("first", job_id="job-9"), 5)
    with pytest.raises(kvrelay.JobIdReused):
        await client.generate("second", job_id="job-9")
    await asyncio.sleep(0.05)  # an abort would be sent in the background
    assert await fake_redis.get(KEYS.abort_flag("job-9")) is None
