"""A stream's memory is bounded whatever its reader does: a reader that falls more than
``stream_buffer_bytes`` behind gets ``SlowReader`` and its job is aborted; a resumed stream
reads its job's log a page at a time and, asked to, keeps no output for ``final()``.

Real Redis; the worker's side is played (``helpers.fake_worker``) so that events can be
published far faster than any reader takes them.
"""

from __future__ import annotations

import tracemalloc

import pytest
import redis.asyncio as aioredis
from helpers.fake_worker import (
    KEYS,
    announce,
    completion_events,
    decode_celery_message,
    play,
    remember,
    wait_until,
)

from kvrelay import AsyncClient
from kvrelay.dispatcher import Mailbox
from kvrelay.errors import SlowReader
from kvrelay.protocol import Started, Tokens

pytestmark = pytest.mark.timeout(60)

MODEL = "m-bounds"


def test_a_mailbox_never_holds_more_than_its_cap() -> None:
    mailbox = Mailbox("job", b"channel", max_bytes=100)
    for _ in range(3):
        mailbox.put(b"x" * 30)
    assert mailbox.buffered == 90
    assert mailbox.take() == b"x" * 30
    mailbox.put(b"y" * 30)
    mailbox.put(b"z" * 30)  # 120 > 100: the reader is too far behind
    assert not mailbox.items
    assert isinstance(mailbox.error, SlowReader)
    mailbox.put(b"w" * 30)
    assert not mailbox.items  # nothing more is kept once the stream is failing


async def test_a_reader_that_falls_behind_gets_slow_reader_and_its_job_is_aborted(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    await announce(raw, "w-1", MODEL)
    big = "x" * 4096
    async with AsyncClient(clean_redis_url, model=MODEL,
                           stream_buffer_bytes=64 << 10) as client:
        stream = client.stream("hi", max_tokens=1000)
        async with stream:
            item = await raw.brpop([KEYS.queue(MODEL)], timeout=10)
            assert item is not None
            _headers, request = decode_celery_message(item[1])
            remember(request)
            # 200 events of 4 KiB (800 KiB) while the reader reads none of them.
            events = [Started(seq=0, worker="w-1"),
                      *[Tokens(seq=i, token_ids=[i], text=big) for i in range(1, 201)]]
            await play(raw, request.job_id, events)
            with pytest.raises(SlowReader):
                async for _ in stream:
                    pass
        # The abort is sent in the background as the stream ends.
        await wait_until(lambda: raw.exists(KEYS.abort_flag(request.job_id)), within=10)


async def test_a_resume_holds_one_page_of_a_long_log_not_all_of_it(
        clean_redis_url: str, raw: aioredis.Redis) -> None:
    job = "job-paged-1"
    texts = ["x" * 4096 for _ in range(3000)]  # a 12 MiB log
    await raw.hset(KEYS.job_record(job), "state", "running")
    await play(raw, job, completion_events(texts))
    async with AsyncClient(clean_redis_url, model=MODEL, require_worker=False) as client:
        tracemalloc.start()
        try:
            stream = await client.resume(job, after_seq=0, keep_output=False)
            seqs: list[int] = []
            async with stream:
                async for chunk in stream:
                    seqs.append(chunk.seq)
                done = await stream.final()
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seqs == list(range(1, 3001))
    assert done.text == ""  # nothing kept for final()...
    assert done.finish_reason == "stop"  # ...but how it ended is there
    assert done.usage.completion_tokens == 3000
    assert peak < 6 << 20, f"peak {peak / (1 << 20):.1f} MiB while reading a 12 MiB log"
