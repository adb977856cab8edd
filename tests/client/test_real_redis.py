"""The client against a real Redis: Celery's producer, the RESP subscriber, reconnects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import (
    ThreadWorker,
    announce,
    completion_events,
    decode_celery_message,
    play,
    remember,
    serve_queue,
    wait_until,
)
from helpers.redis_server import free_port

import kvrelay
from kvrelay import AsyncClient, Client
from kvrelay.keys import Keyspace
from kvrelay.protocol import TASK_NAME, GenerateRequest

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.timeout(60)

MODEL = "m-real"


@contextlib.asynccontextmanager
async def running_worker(redis: Any, **kwargs: Any) -> AsyncIterator[list[GenerateRequest]]:
    seen: list[GenerateRequest] = []
    task = asyncio.create_task(serve_queue(redis, MODEL, seen=seen, **kwargs))
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_celery_message_lands_in_the_model_queue(
    clean_redis_url: str, raw: aioredis.Redis
) -> None:
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False) as client:
        stream = client.stream("Why is the sky blue?", max_tokens=5, seed=3, timeout=30)
        async with asyncio.timeout(20), stream:
            # The job is enqueued when the stream is entered: read it as a worker would.
            item = await raw.brpop([KEYS.queue(MODEL)], timeout=5)
            assert item is not None
            headers, request = decode_celery_message(item[1])
            assert headers["task"] == TASK_NAME
            assert headers["id"] == stream.job_id
            assert request == stream.request
            assert request.deadline is not None
            assert request.reply_to is not None
            assert request.reply_to == client.reply_channel
            remember(request)
            await play(raw, request.job_id, completion_events(["blue", "!"]))
            done = await stream.final()
    assert done.text == "blue!"
    assert done.job_id == request.job_id


async def test_generate_end_to_end_with_a_queue_worker(
    clean_redis_url: str, raw: aioredis.Redis
) -> None:
    await announce(raw, "w-1", MODEL)
    async with running_worker(raw), AsyncClient(clean_redis_url, model=MODEL) as client:
        done = await asyncio.wait_for(client.generate("hi", max_tokens=2), 20)
        assert done.text == "Hello"
        chat = await asyncio.wait_for(
            client.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=2), 20
        )
        assert chat.text == "Hello"
        assert [w.worker_id for w in await client.workers()] == ["w-1"]


async def test_many_concurrent_streams(clean_redis_url: str, raw: aioredis.Redis) -> None:
    def script(request: GenerateRequest) -> list[Any]:
        return completion_events([request.prompt or ""] * 20)

    async with (
        running_worker(raw, script=script, delay=0.001) as seen,
        AsyncClient(clean_redis_url, model=MODEL, require_worker=False) as client,
    ):

        async def one(i: int) -> str:
            async with client.stream(f"<{i}>") as stream:
                return "".join([chunk.text async for chunk in stream])

        texts = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200))), 40)
        assert texts == [f"<{i}>" * 20 for i in range(200)]
        assert len(seen) == 200
        assert client.dispatcher.connects == 1
        assert client.dispatcher.messages >= 200 * 22


async def test_killed_pubsub_connection_is_restored_without_losing_events(
    clean_redis_url: str, raw: aioredis.Redis
) -> None:
    events = completion_events(list("abcdefghijklmnop"))
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False) as client:
        stream = client.stream("x")
        async with asyncio.timeout(20), stream:
            item = await raw.brpop([KEYS.queue(MODEL)], timeout=5)
            assert item is not None
            job = stream.job_id
            remember(decode_celery_message(item[1])[1])
            await play(raw, job, events[:5])
            texts = [(await stream.__anext__()).text for _ in range(4)]
            killed = await raw.client_kill_filter(_type="pubsub")
            assert killed >= 1
            await play(raw, job, events[5:], delay=0.002)
            texts += [chunk.text async for chunk in stream]
        assert "".join(texts) == "abcdefghijklmnop"
        assert client.dispatcher.connects == 2


async def test_redis_restart_mid_stream(redis_server_factory: Any) -> None:
    server = redis_server_factory()
    events = completion_events(list("abcdefgh"))
    async with AsyncClient(
        server.url, model=MODEL, require_worker=False, reconnect_timeout=20
    ) as client:
        raw = aioredis.Redis.from_url(server.url)
        stream = client.stream("x")
        async with asyncio.timeout(30), stream:
            await wait_until(lambda: raw.llen(KEYS.queue(MODEL)), within=5)
            assert stream.request is not None
            remember(stream.request)
            await play(raw, stream.job_id, events[:3])
            texts = [(await stream.__anext__()).text for _ in range(2)]
            await raw.aclose()
            server.restart()  # same port, empty data set
            raw = aioredis.Redis.from_url(server.url)
            await wait_until(lambda: asyncio.sleep(0, client.dispatcher.connects >= 2), within=10)
            await play(raw, stream.job_id, events[3:])
            texts += [chunk.text async for chunk in stream]
        await raw.aclose()
    assert "".join(texts) == "abcdefgh"


async def test_redis_gone_for_good_raises_connection_error(redis_server_factory: Any) -> None:
    server = redis_server_factory()
    async with AsyncClient(
        server.url, model=MODEL, require_worker=False, reconnect_timeout=0.5, connect_timeout=1
    ) as client:
        raw = aioredis.Redis.from_url(server.url)
        stream = client.stream("x")
        async with asyncio.timeout(20), stream:
            assert stream.request is not None
            remember(stream.request)
            await play(raw, stream.job_id, completion_events(list("abc"))[:2])
            await stream.__anext__()
            await raw.aclose()
            server.stop()
            with pytest.raises(kvrelay.BrokerUnavailable):
                await stream.final()


async def test_connection_refused_is_a_clear_error() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    # Calls wait out an outage for reconnect_timeout before they raise.
    client = AsyncClient(url, model=MODEL, connect_timeout=1, reconnect_timeout=1)
    with pytest.raises(kvrelay.BrokerUnavailable, match=f"127.0.0.1:{url.split(':')[2]}"):
        await asyncio.wait_for(client.connect(), 10)
    with pytest.raises(kvrelay.BrokerUnavailable):
        await asyncio.wait_for(client.generate("x"), 10)  # the worker registry read fails
    with pytest.raises(kvrelay.BrokerUnavailable):
        await asyncio.wait_for(client.workers(), 10)
    await client.aclose()
    no_checks = AsyncClient(url, model=MODEL, require_worker=False, connect_timeout=1,
                            reconnect_timeout=1)
    with pytest.raises(kvrelay.BrokerUnavailable, match="cannot connect"):
        await asyncio.wait_for(no_checks.generate("x"), 10)  # the subscriber fails first
    await no_checks.aclose()


async def test_password_protected_redis(redis_server_factory: Any) -> None:
    server = redis_server_factory()
    admin = aioredis.Redis.from_url(server.url)
    await admin.config_set("requirepass", "s3cret")
    await admin.aclose()
    url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    raw = aioredis.Redis.from_url(url)
    async with (
        running_worker(raw),
        AsyncClient(url, model=MODEL, require_worker=False) as client,
    ):
        assert (await asyncio.wait_for(client.generate("x"), 20)).text == "Hello"
    await raw.aclose()
    wrong = AsyncClient(f"redis://:nope@127.0.0.1:{server.port}/0", model=MODEL)
    with pytest.raises(kvrelay.BrokerUnavailable, match=r"\*\*\*"):
        await asyncio.wait_for(wrong.connect(), 10)
    await wrong.aclose()


async def test_heartbeats_expire(clean_redis_url: str, raw: aioredis.Redis) -> None:
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        await announce(raw, "short-lived", MODEL, ttl_ms=150)
        assert [w.worker_id for w in await client.workers()] == ["short-lived"]
        await asyncio.sleep(0.3)
        assert await client.workers() == []
        assert await raw.smembers(KEYS.workers) == set()
        with pytest.raises(kvrelay.UnknownModel):
            await asyncio.wait_for(client.generate("x"), 10)


def test_sync_client(clean_redis_url: str) -> None:
    with (
        ThreadWorker(clean_redis_url, MODEL, texts=["Hel", "lo"]) as worker,
        Client(clean_redis_url, model=MODEL, require_worker=False, stream_timeout=10) as client,
    ):
        assert client.generate("hi", max_tokens=2).text == "Hello"
        with client.stream("hi") as stream:
            chunks = list(stream)
            assert [c.text for c in chunks] == ["Hel", "lo"]
            assert stream.final().text == "Hello"
        with client.stream("hi") as stream:
            assert list(stream.text_stream) == ["Hel", "lo"]
        resumed = client.resume(stream.job_id, after_seq=1)
        assert [c.seq for c in resumed] == [2]
        assert client.workers() == []
        assert len(worker.requests) == 3


def test_sync_client_early_exit_aborts(clean_redis_url: str) -> None:
    import redis

    raw = redis.Redis.from_url(clean_redis_url)
    with (
        ThreadWorker(clean_redis_url, MODEL, texts=["x"] * 200, delay=0.01),
        Client(clean_redis_url, model=MODEL, require_worker=False) as client,
    ):
        with client.stream("hi") as stream:
            for _chunk in stream:
                break
        for _ in range(200):
            if raw.get(KEYS.abort_flag(stream.job_id)):
                break
            import time

            time.sleep(0.01)
        assert raw.get(KEYS.abort_flag(stream.job_id)) == b"1"
    raw.close()
