"""Each error class of the SDK, raised by the situation that causes it, with real workers."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Callable

import pytest
from helpers.celery_send import send_raw
from helpers.job_log import read_events
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import (
    AsyncClient,
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    KvrelayError,
    PayloadTooLarge,
    PromptTooLong,
    ProtocolVersionError,
    QueueFull,
    StreamTimeout,
    UnknownModel,
    WorkerLost,
)
from kvrelay.protocol import PROTOCOL_MAJOR, Started

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
LONG = {"prompt_token_ids": [3, 4, 5], "max_tokens": 3000, "temperature": 0.0,
        "ignore_eos": True}


def test_error_tree() -> None:
    for cls in (InvalidRequest, PromptTooLong, PayloadTooLarge, ProtocolVersionError,
                UnknownModel, QueueFull, DeadlineExceeded, Cancelled, WorkerLost,
                StreamTimeout, kvrelay.BrokerUnavailable):
        assert issubclass(cls, KvrelayError)


async def test_invalid_request_from_client_and_worker(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        with pytest.raises(InvalidRequest, match="temperature"):
            await client.generate("hi", temperature=-1.0)
        with pytest.raises(InvalidRequest, match="vocabulary"):
            await client.generate(prompt_token_ids=[10**7], max_tokens=2)


async def test_prompt_too_long_and_payload_too_large(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        with pytest.raises(PromptTooLong):
            await client.generate(prompt_token_ids=[9] * 5000, max_tokens=2)
        with pytest.raises(PayloadTooLarge):
            await client.generate("x" * (2 << 20), max_tokens=2)


async def test_protocol_version(start_worker: Callable[..., WorkerProcess],
                                clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    job_id = uuid.uuid4().hex
    send_raw(clean_redis_url, MODEL, [(job_id, [{"job_id": job_id, "model": MODEL,
                                                 "protocol_major": PROTOCOL_MAJOR + 1,
                                                 "prompt_token_ids": [1]}], {})])
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        stream = await client.resume(job_id)
        with pytest.raises(ProtocolVersionError):
            await stream.final()


async def test_unknown_model(start_worker: Callable[..., WorkerProcess],
                             clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model="no-such-model") as client:
        with pytest.raises(UnknownModel, match=MODEL):
            await client.generate("hi", max_tokens=2)


async def test_queue_full(clean_redis_url: str) -> None:
    # No worker consumes this model's queue: jobs pile up until the limit refuses more.
    async with AsyncClient(clean_redis_url, model="idle", require_worker=False,
                           max_queue=2) as client:
        streams = [client.stream("hi", max_tokens=2) for _ in range(3)]
        for stream in streams:
            await stream.start()
        assert await client.queue_length() == 3
        with pytest.raises(QueueFull):
            await client.generate("hi", max_tokens=2)
        for stream in streams:
            await stream.aclose()


async def test_deadline_exceeded(start_worker: Callable[..., WorkerProcess],
                                 clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        with pytest.raises(DeadlineExceeded):
            await client.generate(**LONG, timeout=1.0)


async def test_cancelled_by_another_client(start_worker: Callable[..., WorkerProcess],
                                           clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model=MODEL) as watcher, \
            AsyncClient(clean_redis_url, model=MODEL) as canceller:
        stream = watcher.stream(**LONG)
        async with stream:
            await stream.__anext__()
            await canceller.cancel(stream.job_id)
            with pytest.raises(Cancelled):
                await stream.final()


async def test_worker_lost(start_worker: Callable[..., WorkerProcess],
                           clean_redis_url: str) -> None:
    # One attempt allowed: the first worker death fails the job, a live worker reports it.
    doomed = start_worker("doomed", concurrency=2, max_attempts=1)
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        stream = client.stream(**LONG)
        async with stream:
            await stream.__anext__()
            started = [e for e in read_events(clean_redis_url, stream.job_id)
                       if isinstance(e, Started)]
            assert started[0].worker.endswith(f":{doomed.pid}")
            start_worker("witness", concurrency=2, max_attempts=1)
            doomed.kill()
            t0 = time.monotonic()
            with pytest.raises(WorkerLost):
                await stream.final()
            assert time.monotonic() - t0 < 20


async def test_stream_timeout(start_worker: Callable[..., WorkerProcess],
                              clean_redis_url: str) -> None:
    worker = start_worker(concurrency=2)
    async with AsyncClient(clean_redis_url, model=MODEL, stream_timeout=2.0) as client:
        stream = client.stream(**LONG)
        async with stream:
            await stream.__anext__()
            worker.signal(signal.SIGSTOP)  # the worker hangs: nothing more arrives
            try:
                t0 = time.monotonic()
                with pytest.raises(StreamTimeout):
                    await stream.final()
                assert time.monotonic() - t0 < 10
            finally:
                worker.signal(signal.SIGCONT)


async def test_connection_error() -> None:
    client = AsyncClient("redis://127.0.0.1:1/0", model=MODEL, connect_timeout=1.0)
    with pytest.raises(kvrelay.BrokerUnavailable):
        async with client:
            await client.generate("hi", max_tokens=2)
    await asyncio.sleep(0)
