"""One request's memory in the gateway is bounded: a streaming caller that stops reading is
cut off and its job cancelled (blocks freed) while the gateway's memory stays flat, and a
whole answer that could not fit the per-request budget is refused before it is admitted.

Real ``kvrelay gateway`` process, real worker on the tiny random model, real Redis.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from helpers.fake_worker import KEYS, announce, serve_queue
from helpers.gateway_process import GatewayProcess
from helpers.job_log import wait_terminal
from helpers.worker_process import WorkerProcess

from kvrelay.protocol import AnyEvent, Failed, GenerateRequest, Started, Tokens

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
MiB = 1 << 20
SEND_TIMEOUT = 2.0


@pytest.fixture
def gateway(clean_redis_url: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    config = tmp_path / "gateway.toml"
    config.write_text(f"[limits]\nsend_timeout = {SEND_TIMEOUT}\n"
                      "stream_buffer_bytes = 262144\nsocket_send_buffer_bytes = 16384\n")
    process = GatewayProcess(clean_redis_url, tmp_path, "gateway", "--config", str(config))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def rss_bytes(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_reader_that_stops_reading_is_cut_off_and_its_job_cancelled(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        gateway: GatewayProcess) -> None:
    worker = start_worker(concurrency=2)
    httpx.post(f"{gateway.url}/v1/completions", timeout=180,
               json={"model": MODEL, "prompt": [1, 2], "max_tokens": 2})  # warm up
    before = rss_bytes(gateway)
    body = json.dumps({"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 2000, "n": 32,
                       "logprobs": 20, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills up quickly
    sock.settimeout(30)
    sock.connect(("127.0.0.1", gateway.port))
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"\nid: " not in seen:
            seen += sock.recv(4096)
        job = seen.split(b"\nid: ", 1)[1].split(b":", 1)[0].decode()
        # Read nothing more: the gateway's writes stall, then it gives the caller up.
        log = wait_terminal(clean_redis_url, job, timeout=180)
        assert isinstance(log[-1], Failed), log[-1]
        assert log[-1].code == "cancelled"
        stats = worker.wait_for_stats(lambda s: s["running"] == 0, timeout=10)
        assert stats["free_blocks"] == stats["total_blocks"]
        grown = rss_bytes(gateway) - before
        assert grown < 64 * MiB, f"the gateway's RSS grew by {grown / MiB:.0f} MiB"
    finally:
        sock.close()
    assert "cut off a stream's caller" in gateway.tail(100_000)


def test_a_flood_to_a_stalled_reader_is_dropped_and_the_job_aborted(
        clean_redis_url: str, gateway: GatewayProcess) -> None:
    """The same with a worker's side that publishes as fast as Redis takes it (the test
    plays it): the gateway holds at most its stream buffer whatever arrives; the job is
    aborted once the reader is that far behind (``SlowReader``) or its writes stall
    for ``send_timeout``, whichever comes first."""
    big = "x" * (16 << 10)

    def flood(request: GenerateRequest) -> list[AnyEvent]:
        tokens = [Tokens(seq=i, token_ids=[i], text=big) for i in range(1, 4001)]
        return [Started(seq=0, worker="fake-worker-1"), *tokens]

    async def run() -> tuple[str, float, int]:
        redis = aioredis.Redis.from_url(clean_redis_url)
        await announce(redis, "w-1", "fake-model", ttl_ms=120_000)
        worker = asyncio.create_task(serve_queue(redis, "fake-model", flood))
        before = rss_bytes(gateway)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", gateway.port,
            limit=4096)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            body = json.dumps({"model": "fake-model", "prompt": "hi", "max_tokens": 4000,
                               "stream": True}).encode()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            await asyncio.wait_for(reader.readuntil(b"\nid: "), 30)
            job = (await asyncio.wait_for(reader.readuntil(b":"), 30))[:-1].decode()
            reader._transport.pause_reading()  # type: ignore[attr-defined]  # stop reading
            stalled = time.monotonic()
            async with asyncio.timeout(30):
                while not await redis.exists(KEYS.abort_flag(job)):  # noqa: ASYNC110 - Redis state
                    await asyncio.sleep(0.1)
            aborted_after = time.monotonic() - stalled
            grown = rss_bytes(gateway) - before
            return job, aborted_after, grown
        finally:
            writer.close()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await redis.aclose()

    _job, aborted_after, grown = asyncio.run(run())
    assert grown < 64 * MiB, f"the gateway's RSS grew by {grown / MiB:.0f} MiB"
    assert aborted_after < 30


def test_a_whole_answer_over_the_budget_is_refused_at_admission(
        clean_redis_url: str, gateway: GatewayProcess) -> None:
    request = {"model": MODEL, "prompt": "hi", "n": 128, "logprobs": 20,
               "max_tokens": 2**24}
    response = httpx.post(f"{gateway.url}/v1/completions", json=request, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "request_too_large"
    assert error["param"] == "max_tokens"
    redis = sync_redis.Redis.from_url(clean_redis_url)
    try:
        assert redis.dbsize() == 0  # nothing reserved, queued or logged
    finally:
        redis.close()
    # The same request streamed is not held whole: it is not refused by the budget
    # (here it meets the next check: no worker serves the model).
    streamed = httpx.post(f"{gateway.url}/v1/completions", json={**request, "stream": True},
                          timeout=30)
    assert streamed.status_code == 503
    # A modest whole answer passes the budget.
    small = httpx.post(f"{gateway.url}/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "hi", "n": 2, "max_tokens": 8})
    assert small.status_code == 503
    started = time.monotonic()
    assert time.monotonic() - started < 5
