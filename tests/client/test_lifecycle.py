"""Streams on fakeredis: timeouts, aborts on early exit, admission, cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from helpers.fake_worker import announce, completion_events, emit, play, wait_until

import kvrelay
from kvrelay import AsyncClient
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    AbortMessage,
    GenerateRequest,
    Started,
    Tokens,
    decode_control,
)

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.timeout(20)


async def _aborted(redis: Any, job_id: str) -> bool:
    return bool(await redis.get(KEYS.abort_flag(job_id)) == b"1")


async def slow_worker(w: Any, request: GenerateRequest) -> None:
    """Starts, then streams a token every 20 ms for a long time (unless aborted)."""
    job = request.job_id
    await emit(w.redis, job, Started(seq=0, worker="w"))
    for seq in range(1, 500):
        if await _aborted(w.redis, job):
            return
        await emit(w.redis, job, Tokens(seq=seq, token_ids=[seq], text="x"))
        await asyncio.sleep(0.02)


async def silent_worker(w: Any, request: GenerateRequest) -> None:
    """Takes the job and never says anything."""


# ---------------------------------------------------------------------- aborts


async def test_break_then_leaving_async_with_aborts(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    control = fake_redis.pubsub()
    await control.subscribe(KEYS.control_channel)
    worker.behaviour = slow_worker
    async with asyncio.timeout(5):
        async with client.stream("x") as stream:
            async for _chunk in stream:
                break
        job = stream.job_id
        await wait_until(lambda: _aborted(fake_redis, job))
        while True:
            message = await control.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                break
    assert decode_control(message["data"]) == AbortMessage(job_id=job)
    ttl = await fake_redis.ttl(KEYS.abort_flag(job))
    assert 0 < ttl <= 3600
    await control.aclose()


async def test_aclose_aborts(client: AsyncClient, worker: Any, fake_redis: Any) -> None:
    worker.behaviour = slow_worker
    stream = client.stream("x")
    async with asyncio.timeout(5):
        await stream.__anext__()
        await stream.aclose()
        await wait_until(lambda: _aborted(fake_redis, stream.job_id))
    with pytest.raises(kvrelay.Cancelled):
        await stream.final()


async def test_cancelling_generate_aborts(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    worker.behaviour = slow_worker
    task = asyncio.create_task(client.generate("x"))
    await wait_until(lambda: asyncio.sleep(0, bool(worker.requests)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    job = worker.requests[0].job_id
    await wait_until(lambda: _aborted(fake_redis, job))


async def test_cancelling_a_stream_consumer_aborts(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    worker.behaviour = slow_worker

    async def consume() -> None:
        async with client.stream("x") as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: _aborted(fake_redis, worker.requests[0].job_id))


async def test_leaving_after_the_terminal_event_sends_nothing(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    async with asyncio.timeout(5), client.stream("x") as stream:
        async for _ in stream:
            pass
    await asyncio.sleep(0.05)
    assert not await fake_redis.exists(KEYS.abort_flag(stream.job_id))


async def test_leaving_after_a_failed_event_sends_nothing(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    async def fails(w: Any, request: GenerateRequest) -> None:
        await emit(
            w.redis, request.job_id, kvrelay.protocol.Failed(seq=0, code="internal", message="x")
        )

    worker.behaviour = fails
    with pytest.raises(kvrelay.InternalError):
        await asyncio.wait_for(client.generate("x"), 5)
    await asyncio.sleep(0.05)
    assert not await fake_redis.exists(KEYS.abort_flag(worker.requests[0].job_id))


async def test_client_cancel(client: AsyncClient, fake_redis: Any) -> None:
    await asyncio.wait_for(client.cancel("some-job"), 5)
    assert await _aborted(fake_redis, "some-job")


async def test_closing_the_client_aborts_live_streams(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client = make_client()
    worker.behaviour = slow_worker
    stream = client.stream("x")
    await asyncio.wait_for(stream.__anext__(), 5)
    await asyncio.wait_for(client.aclose(), 5)
    assert await _aborted(fake_redis, stream.job_id)
    with pytest.raises(kvrelay.KvrelayError):
        client.stream("y")


# ---------------------------------------------------------------------- timeouts


async def test_inactivity_timeout_raises_and_aborts(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client = make_client(stream_timeout=0.2)
    worker.behaviour = silent_worker
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(kvrelay.StreamTimeout) as info:
        await asyncio.wait_for(client.generate("x"), 5)
    assert 0.15 < loop.time() - start < 2
    assert isinstance(info.value, TimeoutError)
    await wait_until(lambda: _aborted(fake_redis, worker.requests[0].job_id))


async def test_per_call_stream_timeout(make_client: Any, worker: Any) -> None:
    client = make_client(stream_timeout=30)
    worker.behaviour = silent_worker
    with pytest.raises(kvrelay.StreamTimeout):
        await asyncio.wait_for(client.generate("x", stream_timeout=0.1), 5)


async def test_inactivity_timer_resets_on_each_event(make_client: Any, worker: Any) -> None:
    client = make_client(stream_timeout=0.25)

    async def steady(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events(list("abcdefgh")), delay=0.1)

    worker.behaviour = steady
    done = await asyncio.wait_for(client.generate("x"), 5)
    assert done.text == "abcdefgh"


async def test_timeout_sets_the_deadline_and_is_enforced(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    worker.behaviour = slow_worker
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(kvrelay.DeadlineExceeded):
        await asyncio.wait_for(client.generate("x", timeout=0.3), 5)
    assert 0.25 < loop.time() - start < 2
    request = worker.requests[0]
    assert request.deadline is not None
    assert request.deadline == pytest.approx(request.enqueued_at + 0.3)
    await wait_until(lambda: _aborted(fake_redis, request.job_id))


# ---------------------------------------------------------------------- admission


async def test_unknown_model_is_refused_before_enqueue(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client = make_client(require_worker=True)
    with pytest.raises(kvrelay.UnknownModel, match="none"):
        await asyncio.wait_for(client.generate("x"), 5)
    await announce(fake_redis, "w-other", "other-model")
    await asyncio.sleep(0.15)  # a negative answer is reused for 0.1 s
    with pytest.raises(kvrelay.UnknownModel, match="other-model"):
        await asyncio.wait_for(client.generate("x"), 5)
    assert worker.requests == []
    await announce(fake_redis, "w-m", "m")
    await asyncio.sleep(0.15)
    done = await asyncio.wait_for(client.generate("x"), 5)
    assert done.text == "Hello"


async def test_require_worker_false_enqueues_ahead_of_workers(
    make_client: Any, worker: Any
) -> None:
    client = make_client(require_worker=False)
    assert (await asyncio.wait_for(client.generate("x"), 5)).text == "Hello"


async def test_workers_lists_live_ones_and_prunes_dead(
    client: AsyncClient, fake_redis: Any
) -> None:
    await announce(fake_redis, "w1", "m", stats={"running": 2, "free_blocks": 10})
    await announce(fake_redis, "w2", "m")
    await fake_redis.sadd(KEYS.workers, "w-dead")  # heartbeat long gone
    workers = await asyncio.wait_for(client.workers(), 5)
    assert [w.worker_id for w in workers] == ["w1", "w2"]
    assert workers[0].stats == {"running": 2, "free_blocks": 10}
    assert await fake_redis.smembers(KEYS.workers) == {b"w1", b"w2"}


async def test_queue_full(make_client: Any, worker: Any, fake_redis: Any) -> None:
    client = make_client(max_queue=2)
    await fake_redis.rpush(KEYS.queue("m"), b"a", b"b")
    assert (await asyncio.wait_for(client.generate("x"), 5)).text == "Hello"  # 2 is not > 2
    await fake_redis.rpush(KEYS.queue("m"), b"c")
    with pytest.raises(kvrelay.QueueFull):
        await asyncio.wait_for(client.generate("x"), 5)
    assert len(worker.requests) == 1


async def test_enqueue_failure_is_reported_and_aborts(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    worker.fail_enqueue = kvrelay.BrokerUnavailable("broker down")
    with pytest.raises(kvrelay.BrokerUnavailable, match="broker down"):
        await asyncio.wait_for(client.generate("x", job_id="job-ef"), 5)
    await wait_until(lambda: _aborted(fake_redis, "job-ef"))
    assert client.dispatcher.live_channels == 0


async def test_invalid_requests_enqueue_nothing(client: AsyncClient, worker: Any) -> None:
    with pytest.raises(kvrelay.InvalidRequest):
        await client.generate("x", temperature=-1)
    with pytest.raises(kvrelay.InvalidRequest):
        await client.generate()
    with pytest.raises(kvrelay.PayloadTooLarge):
        await client.generate("x" * (2 << 20))
    with pytest.raises(TypeError):
        await client.generate("x", temperture=1.0)  # type: ignore[call-arg]
    assert worker.requests == []


async def test_request_travels_as_the_wire_type(client: AsyncClient, worker: Any) -> None:
    await asyncio.wait_for(
        client.generate(
            "x",
            stop="END",
            logit_bias={5: 1.5},
            priority=3,
            cache_salt="tenant-a",
            top_k=40,
            min_p=0.05,
        ),
        5,
    )
    request = worker.requests[0]
    payload = kvrelay.protocol.request_to_payload(request)
    assert msgspec.json.decode(msgspec.json.encode(payload))["sampling"]["stop"] == ["END"]
    assert kvrelay.protocol.decode_request_json(msgspec.json.encode(payload)) == request
    assert request.priority == 3
    assert request.cache_salt == "tenant-a"
    assert request.sampling.logit_bias == {5: 1.5}


async def test_an_abandoned_stream_is_released_and_aborted(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    import gc

    worker.behaviour = slow_worker
    stream = client.stream("x")
    await asyncio.wait_for(stream.__anext__(), 5)
    job = stream.job_id
    del stream
    gc.collect()
    await wait_until(lambda: _aborted(fake_redis, job))
    await wait_until(lambda: asyncio.sleep(0, client.dispatcher.live_channels == 0))
