"""Streams on fakeredis: results, ordering, duplicates, gaps, resume, typed errors."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from helpers.fake_worker import (
    channels_of,
    completion_events,
    emit,
    failed_event,
    message,
    play,
    wait_until,
)

import kvrelay
from kvrelay import AsyncClient, Completion, StreamChunk, event_log
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    Finished,
    GenerateRequest,
    Started,
    TokenLogprob,
    Tokens,
    TopLogprob,
    Usage,
    encode_event,
)

KEYS = Keyspace()  # the default namespace

pytestmark = pytest.mark.timeout(20)


async def test_generate_returns_the_whole_completion(client: AsyncClient, worker: Any) -> None:
    done = await asyncio.wait_for(client.generate("Why?", max_tokens=8, seed=1), 5)
    assert isinstance(done, Completion)
    assert done.text == "Hello"
    assert done.token_ids == [100, 101]
    assert done.finish_reason == "stop"
    assert done.usage == Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
    assert done.worker == "fake-worker-1"
    assert done.attempts == 1
    assert done.model == "m"
    assert done.timings.total == pytest.approx(0.006)
    [request] = worker.requests
    assert done.job_id == request.job_id
    assert request.prompt == "Why?"
    assert request.sampling.max_tokens == 8
    assert request.sampling.seed == 1


async def test_messages_and_token_ids_reach_the_request(client: AsyncClient, worker: Any) -> None:
    await asyncio.wait_for(
        client.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=4), 5
    )
    await asyncio.wait_for(client.generate(prompt_token_ids=[1, 2, 3], max_tokens=4), 5)
    chat, ids = worker.requests
    assert chat.messages[0].role == "user"
    assert chat.messages[0].content == "Hi"
    assert chat.prompt is None
    assert ids.prompt_token_ids == [1, 2, 3]


async def test_stream_yields_chunks_in_order_then_final(client: AsyncClient) -> None:
    async with asyncio.timeout(5):
        async with client.stream("story", max_tokens=2) as stream:
            chunks = [chunk async for chunk in stream]
            final = await stream.final()
    assert [c.text for c in chunks] == ["Hel", "lo"]
    assert [c.seq for c in chunks] == [1, 2]
    assert all(isinstance(c, StreamChunk) and c.index == 0 for c in chunks)
    assert final.text == "Hello"
    assert stream.done
    assert stream.last_seq == 3


async def test_text_stream(client: AsyncClient) -> None:
    async with asyncio.timeout(5), client.stream("x") as stream:
        texts = [t async for t in stream.text_stream]
    assert texts == ["Hel", "lo"]


async def test_iterating_without_async_with_starts_the_job(client: AsyncClient) -> None:
    stream = client.stream("x")
    async with asyncio.timeout(5):
        texts = [c.text async for c in stream]
    assert texts == ["Hel", "lo"]


async def test_n_choices(client: AsyncClient, worker: Any) -> None:
    async def two_choices(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events([["a", "b"], ["c"]]))

    worker.behaviour = two_choices
    done = await asyncio.wait_for(client.generate("x", n=2), 5)
    assert [c.text for c in done.choices] == ["ab", "c"]
    assert [c.token_ids for c in done.choices] == [[100, 101], [1100]]
    assert [c.finish_reason for c in done.choices] == ["stop", "stop"]
    assert done.text == "ab"
    assert worker.requests[0].sampling.n == 2


async def test_logprobs_are_collected(client: AsyncClient, worker: Any) -> None:
    lp = [TokenLogprob(token_id=7, logprob=-0.5, top=[TopLogprob(7, -0.5), TopLogprob(8, -1.0)])]

    async def with_logprobs(w: Any, request: GenerateRequest) -> None:
        await play(
            w.redis,
            request.job_id,
            [
                Started(seq=0, worker="w"),
                Tokens(seq=1, token_ids=[7], text="x", logprobs=lp),
                Finished(seq=2, finish_reason="length"),
            ],
        )

    worker.behaviour = with_logprobs
    async with asyncio.timeout(5), client.stream("x", logprobs=2) as stream:
        [chunk] = [c async for c in stream]
        done = await stream.final()
    assert chunk.logprobs == lp
    assert done.logprobs == lp
    assert done.choices[0].logprobs == lp
    assert done.finish_reason == "length"


# ---------------------------------------------------------------------- ordering


async def test_duplicates_are_dropped(client: AsyncClient, worker: Any) -> None:
    async def dupes(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events(["a", "b", "c"]), duplicate={1, 2})

    worker.behaviour = dupes
    async with asyncio.timeout(5), client.stream("x") as stream:
        chunks = [c async for c in stream]
    assert [c.text for c in chunks] == ["a", "b", "c"]


async def test_gap_is_filled_from_the_log(client: AsyncClient, worker: Any) -> None:
    async def lossy(w: Any, request: GenerateRequest) -> None:
        # Seqs 2 and 3 only reach the log; the client sees 4 and must fetch 2..3.
        await play(w.redis, request.job_id, completion_events(list("abcde")), skip_publish={2, 3})

    worker.behaviour = lossy
    async with asyncio.timeout(5), client.stream("x") as stream:
        chunks = [c async for c in stream]
        done = await stream.final()
    assert [c.seq for c in chunks] == [1, 2, 3, 4, 5]
    assert done.text == "abcde"


async def test_out_of_order_publishes_are_reordered(client: AsyncClient, worker: Any) -> None:
    events = completion_events(list("abcd"))

    async def shuffled(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, events, publish_order=[0, 2, 1, 4, 3, 5, 3, 1])

    worker.behaviour = shuffled
    async with asyncio.timeout(5), client.stream("x") as stream:
        chunks = [c async for c in stream]
    assert [c.seq for c in chunks] == [1, 2, 3, 4]
    assert "".join(c.text for c in chunks) == "abcd"


async def test_events_only_in_the_log_are_found_by_the_inactivity_check(
    make_client: Any, worker: Any
) -> None:
    client = make_client(stream_timeout=0.3)

    async def silent(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events(["a"]), skip_publish={0, 1, 2})

    worker.behaviour = silent
    done = await asyncio.wait_for(client.generate("x"), 5)
    assert done.text == "a"


async def test_unknown_event_types_keep_their_seq(client: AsyncClient, worker: Any) -> None:
    import msgspec

    async def newer_worker(w: Any, request: GenerateRequest) -> None:
        job = request.job_id
        await emit(w.redis, job, Started(seq=0, worker="w"))
        data = msgspec.msgpack.encode({"type": "progress", "seq": 1, "pct": 50})
        await event_log.add_entry(w.redis, KEYS.event_log(job), 1, pack_events([data]))
        for channel in channels_of(job):
            await w.redis.publish(channel, message(job, data))
        await emit(w.redis, job, Tokens(seq=2, token_ids=[5], text="z"))
        await emit(w.redis, job, Finished(seq=3, finish_reason="stop"))

    worker.behaviour = newer_worker
    done = await asyncio.wait_for(client.generate("x"), 5)
    assert done.text == "z"


# ---------------------------------------------------------------------- resume


async def test_resume_a_finished_job_from_the_log(client: AsyncClient, fake_redis: Any) -> None:
    await play(fake_redis, "job-r1", completion_events(list("abcd")))
    stream = await asyncio.wait_for(client.resume("job-r1", after_seq=2), 5)
    async with asyncio.timeout(5), stream:
        chunks = [c async for c in stream]
        done = await stream.final()
    assert [c.seq for c in chunks] == [3, 4]
    assert done.text == "abcd"  # the final result covers the whole job
    assert done.job_id == "job-r1"


async def test_resume_a_live_job(client: AsyncClient, fake_redis: Any) -> None:
    events = completion_events(list("abcdef"))
    await play(fake_redis, "job-r2", events[:3])  # before the client subscribes
    stream = await asyncio.wait_for(client.resume("job-r2", after_seq=0), 5)
    await play(fake_redis, "job-r2", events[3:], delay=0.01)
    async with asyncio.timeout(5), stream:
        chunks = [c async for c in stream]
    assert "".join(c.text for c in chunks) == "abcdef"


async def test_a_resumed_stream_counts_itself_among_the_jobs_watchers(
    client: AsyncClient, fake_redis: Any
) -> None:
    """Its worker publishes on the job's own channel only while the count is above 0."""
    events = completion_events(list("ab"))
    await play(fake_redis, "job-w", events[:2])
    watchers = KEYS.watchers("job-w")
    stream = await asyncio.wait_for(client.resume("job-w"), 5)
    assert await fake_redis.get(watchers) == b"1"
    assert 0 < await fake_redis.ttl(watchers) <= 3600
    assert await fake_redis.scard(KEYS.watching) == 1  # and in the set over every job
    second = await asyncio.wait_for(client.resume("job-w"), 5)
    assert await fake_redis.get(watchers) == b"2"
    assert await fake_redis.scard(KEYS.watching) == 2
    assert 0 < await fake_redis.ttl(KEYS.watching) <= 3600
    await second.aclose()
    await play(fake_redis, "job-w", events[2:])
    async with asyncio.timeout(5), stream:
        assert (await stream.final()).text == "ab"

    async def released() -> bool:  # the count goes with its last watcher
        return (not await fake_redis.exists(watchers)
                and not await fake_redis.exists(KEYS.watching))

    await wait_until(released)


async def test_resume_after_terminal_yields_nothing(client: AsyncClient, fake_redis: Any) -> None:
    events = completion_events(["a"])
    await play(fake_redis, "job-r3", events)
    stream = await asyncio.wait_for(client.resume("job-r3", after_seq=events[-1].seq), 5)
    assert stream.done
    assert [c async for c in stream] == []
    assert (await stream.final()).text == "a"


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("prompt_too_long", kvrelay.PromptTooLong),
        ("cancelled", kvrelay.Cancelled),
        ("deadline_exceeded", kvrelay.DeadlineExceeded),
        ("worker_lost", kvrelay.WorkerLost),
        ("unknown_model", kvrelay.UnknownModel),
        ("something_new", kvrelay.InternalError),
    ],
)
async def test_failed_event_raises_the_typed_error(
    client: AsyncClient, worker: Any, code: str, error: type[Exception]
) -> None:
    async def failing(w: Any, request: GenerateRequest) -> None:
        await emit(w.redis, request.job_id, Started(seq=0, worker="w"))
        await emit(w.redis, request.job_id, Tokens(seq=1, token_ids=[1], text="a"))
        await emit(w.redis, request.job_id, failed_event(2, code, "worker says no"))

    worker.behaviour = failing
    with pytest.raises(error) as info:
        await asyncio.wait_for(client.generate("x"), 5)
    assert info.value.job_id == worker.requests[0].job_id
    assert "worker says no" in str(info.value)

    # The same through iteration: chunks first, then the error, again from final().
    async with asyncio.timeout(5), client.stream("x") as stream:
        seen = [(await stream.__anext__()).text]
        with pytest.raises(error):
            await stream.__anext__()
        assert seen == ["a"]
        with pytest.raises(error):
            await stream.final()


async def test_garbage_on_the_channel_is_ignored(client: AsyncClient, worker: Any) -> None:
    async def noisy(w: Any, request: GenerateRequest) -> None:
        assert request.reply_to is not None
        # Not a message at all; a message whose events are not events.
        await w.redis.publish(request.reply_to, b"\xc1not msgpack")
        not_events = pack_events([b"\x01", msgspec.msgpack.encode({"x": 1})])
        await w.redis.publish(request.reply_to,
                              pack_message([pack_pair(request.job_id, not_events)]))
        await play(w.redis, request.job_id, completion_events(["ok"]))

    worker.behaviour = noisy
    assert (await asyncio.wait_for(client.generate("x"), 5)).text == "ok"
    assert client.dispatcher.unreadable == 1


async def test_many_concurrent_streams_share_one_subscriber(
    client: AsyncClient, worker: Any
) -> None:
    async def varied(w: Any, request: GenerateRequest) -> None:
        n = int(request.prompt or "0")
        await play(w.redis, request.job_id, completion_events([str(n)] * 3), delay=0.001)

    worker.behaviour = varied
    results = await asyncio.wait_for(
        asyncio.gather(*(client.generate(str(i)) for i in range(50))), 10
    )
    assert [r.text for r in results] == [str(i) * 3 for i in range(50)]
    assert client.dispatcher.connects == 1
    await asyncio.sleep(0.05)
    assert client.dispatcher.live_channels == 0


def test_event_encoding_round_trip_is_what_the_client_reads() -> None:
    event = Tokens(seq=3, token_ids=[1, 2], text="hi", index=1)
    from kvrelay.protocol import decode_event

    assert decode_event(encode_event(event)) == event


async def test_resume_an_unknown_job_says_so_at_once(client: AsyncClient) -> None:
    async with asyncio.timeout(5):  # not the client's stream_timeout
        with pytest.raises(kvrelay.UnknownJob, match="no such job") as caught:
            await client.resume("job-never-enqueued")
    assert caught.value.job_id == "job-never-enqueued"
    assert isinstance(caught.value, LookupError)


async def test_resume_a_job_still_in_its_queue(client: AsyncClient, fake_redis: Any) -> None:
    # A Celery message as kombu stores it: the job id in its JSON headers.
    message = '{"body": "", "headers": {"id": "job-queued", "task": "kvrelay.generate"}}'
    await fake_redis.lpush(KEYS.queue("m"), message)
    stream = await asyncio.wait_for(client.resume("job-queued"), 5)
    await play(fake_redis, "job-queued", completion_events(list("ok")))
    async with asyncio.timeout(5):
        assert (await stream.final()).text == "ok"
