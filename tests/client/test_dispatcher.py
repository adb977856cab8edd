"""The shared subscriber: RESP parsing, reconnect + resync, giving up, channel sharing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from helpers.fake_worker import claim, completion_events, emit, play, wait_until

import kvrelay
from kvrelay import AsyncClient
from kvrelay.dispatcher import RedisPyTransport, Transport
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.protocol import GenerateRequest, encode_event
from kvrelay.resp import Endpoint, Frame, RespError, RespParser, TransportLost, pack_command

pytestmark = pytest.mark.timeout(20)


# ---------------------------------------------------------------------- RESP


def test_pack_command() -> None:
    assert pack_command(b"SUBSCRIBE", "a", 7) == b"*3\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n$1\r\n7\r\n"


def test_parser_handles_every_split_point() -> None:
    wire = (
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nab\r\nc\r\n"
        b"+OK\r\n-ERR nope\r\n$-1\r\n*2\r\n$4\r\npong\r\n$0\r\n\r\n"
    )
    expected_len = 6
    for split in range(len(wire) + 1):
        parser = RespParser()
        values = parser.feed(wire[:split]) + parser.feed(wire[split:])
        assert len(values) == expected_len, split
        assert values[0] == [b"subscribe", b"ch", 1]
        assert values[1] == [b"message", b"ch", b"ab\r\nc"]
        assert values[2] == b"OK"
        assert isinstance(values[3], RespError)
        assert "nope" in str(values[3])
        assert values[4] is None
        assert values[5] == [b"pong", b""]


def test_parser_byte_by_byte() -> None:
    wire = b"*3\r\n$7\r\nmessage\r\n$3\r\nabc\r\n$3\r\n\x00\x01\x02\r\n" * 3
    parser = RespParser()
    values: list[Any] = []
    for i in range(len(wire)):
        values.extend(parser.feed(wire[i : i + 1]))
    assert values == [[b"message", b"abc", b"\x00\x01\x02"]] * 3


def test_endpoint_from_url() -> None:
    plain = Endpoint.from_url("redis://localhost:6400/2")
    assert (plain.host, plain.port, plain.password, plain.ssl_context) == (
        "localhost",
        6400,
        None,
        None,
    )
    auth = Endpoint.from_url("redis://user:secret@h:1/0")
    assert (auth.username, auth.password) == ("user", "secret")
    unix = Endpoint.from_url("unix:///tmp/redis.sock?db=1")
    assert unix.path == "/tmp/redis.sock"
    tls = Endpoint.from_url("rediss://h:6380?ssl_cert_reqs=none")
    assert tls.ssl_context is not None
    assert not tls.ssl_context.check_hostname


def test_redact_url() -> None:
    from kvrelay.connection import redact_url

    assert redact_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert redact_url("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


# ---------------------------------------------------------------------- reconnect


class BreakableTransport:
    """Wraps a real transport; ``break_()`` makes it fail like a dropped connection."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.broken = asyncio.Event()

    async def subscribe(self, channels: Sequence[bytes]) -> None:
        await self.inner.subscribe(channels)

    async def unsubscribe(self, channels: Sequence[bytes]) -> None:
        await self.inner.unsubscribe(channels)

    async def ping(self) -> None:
        await self.inner.ping()

    async def read(self, idle: float) -> list[Frame] | None:
        if self.broken.is_set():
            raise TransportLost("broken by the test")
        reader = asyncio.ensure_future(self.inner.read(idle))
        breaker = asyncio.ensure_future(self.broken.wait())
        try:
            done, _ = await asyncio.wait({reader, breaker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            breaker.cancel()
        if reader in done:
            return reader.result()
        reader.cancel()
        raise TransportLost("broken by the test")

    async def aclose(self) -> None:
        await self.inner.aclose()

    def break_(self) -> None:
        self.broken.set()


class FlakyFactory:
    """Transport factory for a client on fakeredis, with outages on demand."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.transports: list[BreakableTransport] = []
        self.down = False
        self.attempts = 0

    async def __call__(self) -> Transport:
        self.attempts += 1
        if self.down:
            raise ConnectionRefusedError("test outage")
        transport = BreakableTransport(await RedisPyTransport.open(self.redis))
        self.transports.append(transport)
        return transport

    async def outage(self) -> None:
        self.down = True
        transport = self.transports[-1]
        transport.break_()
        await transport.inner.aclose()  # the server forgets our subscriptions


def flaky(client: AsyncClient, redis: Any) -> FlakyFactory:
    factory = FlakyFactory(redis)
    client.dispatcher._factory = factory
    return factory


async def test_reconnect_resubscribes_and_fills_the_gap_from_the_log(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client = make_client(reconnect_timeout=5)
    factory = flaky(client, fake_redis)
    events = completion_events(list("abcdefghij"))
    resumed = asyncio.Event()

    async def with_outage(w: Any, request: GenerateRequest) -> None:
        job = request.job_id
        await play(w.redis, job, events[:4])  # Started + a b c
        await asyncio.sleep(0.05)
        await factory.outage()
        await play(w.redis, job, events[4:8])  # d e f g: logged, published to nobody
        factory.down = False
        await resumed.wait()
        await play(w.redis, job, events[8:], delay=0.005)

    worker.behaviour = with_outage
    texts: list[str] = []
    async with asyncio.timeout(10), client.stream("x") as stream:
        async for chunk in stream:
            texts.append(chunk.text)
            if len(texts) == 3:
                # Wait for the reconnect before the worker goes on.
                await wait_until(
                    lambda: asyncio.sleep(
                        0, client.dispatcher.connects >= 2 and client.dispatcher.connected
                    )
                )
                resumed.set()
        done = await stream.final()
    assert "".join(texts) == "abcdefghij"
    assert done.text == "abcdefghij"
    assert client.dispatcher.connects == 2
    assert factory.attempts >= 3  # at least one refused attempt in between


async def test_redis_gone_for_good_fails_live_streams(
    make_client: Any, worker: Any, fake_redis: Any
) -> None:
    client = make_client(reconnect_timeout=0.3)
    factory = flaky(client, fake_redis)

    async def dies(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events(["a", "b"])[:2])
        await factory.outage()

    worker.behaviour = dies
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(kvrelay.BrokerUnavailable, match="could not reconnect"):
        await asyncio.wait_for(client.generate("x"), 5)
    assert loop.time() - start < 3
    # Once Redis is back, new streams work again.
    factory.down = False

    async def healthy(w: Any, request: GenerateRequest) -> None:
        await play(w.redis, request.job_id, completion_events(["Hel", "lo"]))

    worker.behaviour = healthy
    assert (await asyncio.wait_for(client.generate("x"), 5)).text == "Hello"


async def test_first_connection_refused_fails_fast(make_client: Any, fake_redis: Any) -> None:
    client = make_client(reconnect_timeout=30)
    factory = flaky(client, fake_redis)
    factory.down = True
    with pytest.raises(kvrelay.BrokerUnavailable, match="cannot connect"):
        await asyncio.wait_for(client.generate("x"), 2)


# ---------------------------------------------------------------------- sharing


async def test_two_streams_on_one_job_both_get_everything(
    client: AsyncClient, fake_redis: Any
) -> None:
    events = completion_events(list("abc"))
    await play(fake_redis, "job-2x", events[:1])
    first = await asyncio.wait_for(client.resume("job-2x"), 5)
    second = await asyncio.wait_for(client.resume("job-2x"), 5)
    await play(fake_redis, "job-2x", events[1:])
    async with asyncio.timeout(5):
        assert (await first.final()).text == "abc"
        assert (await second.final()).text == "abc"


async def test_leaving_one_stream_keeps_the_other_subscribed(
    client: AsyncClient, fake_redis: Any
) -> None:
    events = completion_events(list("abcd"))
    await claim(fake_redis, "job-k")
    first = await asyncio.wait_for(client.resume("job-k"), 5)
    second = await asyncio.wait_for(client.resume("job-k"), 5)
    await first.aclose()  # aborts the job in real life; here the fake worker goes on
    await asyncio.sleep(0.02)
    await play(fake_redis, "job-k", events)
    async with asyncio.timeout(5):
        assert (await second.final()).text == "abcd"


async def test_resubscribing_right_after_leaving(client: AsyncClient, fake_redis: Any) -> None:
    await claim(fake_redis, "job-flip")
    for _ in range(5):
        stream = await asyncio.wait_for(client.resume("job-flip"), 5)
        await stream.aclose()
    stream = await asyncio.wait_for(client.resume("job-flip"), 5)
    await emit(fake_redis, "job-flip", completion_events(["z"])[0])
    await play(fake_redis, "job-flip", completion_events(["z"])[1:])
    async with asyncio.timeout(5):
        assert (await stream.final()).text == "z"


async def test_a_clients_jobs_share_one_channel_and_one_message_feeds_each_its_own(
    client: AsyncClient, worker: Any, fake_redis: Any
) -> None:
    """What a worker's batch does: one message on the client's channel, a pair per job."""
    worker.behaviour = None  # nobody answers: this test publishes
    streams = [client.stream(f"p{i}") for i in range(3)]
    for stream in streams:
        await stream.start()
    assert client.dispatcher.live_channels == 1
    requests = list(worker.requests)
    assert {r.reply_to for r in requests} == {client.reply_channel}
    per_job = {r.job_id: completion_events([r.job_id[:4], "!"]) for r in requests}
    for step in range(4):  # Started, two Tokens, Finished: one message per step
        await fake_redis.publish(client.reply_channel, pack_message([
            pack_pair(job_id, pack_events([encode_event(events[step])]))
            for job_id, events in per_job.items()]))
    async with asyncio.timeout(5):
        for stream in streams:
            assert (await stream.final()).text == stream.job_id[:4] + "!"
    assert client.dispatcher.messages == 4
