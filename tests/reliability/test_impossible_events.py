"""The SDK ignores events that no worker of the job could have sent.

Raw ``PUBLISH``es on the client's reply channel (where a worker sends the job's events),
before its worker exists: a ``Tokens`` with a
choice index >= n at the next seq, and a ``Failed`` and a ``Tokens`` with seqs far
ahead. Before the fix the stream took the bogus choice as event 0 (the completion grew
to 8 choices and lost the worker's first event) and, waiting for the gap up to the
far-ahead ``Failed``, gave up within a second with "events 0..N are missing". Now the
stream drops them, counts them, and the job completes through a real worker exactly as
a clean run does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.protocol import Failed, Tokens, encode_event

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = {"prompt_token_ids": [11, 12, 13], "max_tokens": 8, "temperature": 0.0,
       "ignore_eos": True}


async def test_bogus_events_are_ignored(clean_redis_url: str,
                                        start_worker: Callable[..., WorkerProcess]) -> None:
    raw = aioredis.Redis.from_url(clean_redis_url)
    try:
        async with AsyncClient(clean_redis_url, model="llama-mqa", require_worker=False,
                               stream_timeout=120) as client:
            async with client.stream(**JOB) as stream:  # type: ignore[arg-type]
                channel = client.reply_channel
                bogus = [
                    Tokens(seq=0, index=7, token_ids=[1], text="x"),
                    Failed(seq=10**9, code="internal", message="injected"),
                    Tokens(seq=10**6, index=0, token_ids=[2], text="y"),
                ]
                for event in bogus:
                    message = pack_message([pack_pair(stream.job_id,
                                                      pack_events([encode_event(event)]))])
                    assert await raw.publish(channel, message) == 1
                consumer = asyncio.create_task(stream.final())
                await asyncio.sleep(2.0)  # longer than the old gap give-up (~0.75 s)
                assert not consumer.done(), consumer.result()
                await asyncio.to_thread(start_worker, "late")
                done = await asyncio.wait_for(consumer, 120)
                assert stream.ignored_events == len(bogus)
            clean = await client.generate(**JOB)  # type: ignore[arg-type]
    finally:
        await raw.aclose()
    assert len(done.choices) == 1
    assert done.token_ids == clean.token_ids
    assert done.text == clean.text
