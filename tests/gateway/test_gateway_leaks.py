"""What a stranger (or a log reader) can learn from the gateway: no Redis password in what
it prints, no internals in ``/health`` or in a 500, and API keys read whole.

Real ``kvrelay gateway`` processes on a real Redis. Where a worker's failure is needed, the
test plays the worker's side of the queue (``helpers.fake_worker``): a real worker cannot
be made to fail with an internal error on demand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from helpers.fake_worker import announce, serve_queue
from helpers.gateway_process import GatewayProcess, free_port

from kvrelay.protocol import ErrorCode, Failed, GenerateRequest, Started

pytestmark = pytest.mark.integration

SECRET = "s3cret-pa55word"
MODEL = "fake-model"


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(redis_url: str, *args: str, **env: Any) -> GatewayProcess:
        gateway = GatewayProcess(redis_url, tmp_path, f"gateway-{len(started)}", *args, **env)
        started.append(gateway)
        return gateway.start()

    yield start
    for gateway in started:
        gateway.stop()


def test_the_redis_password_is_never_printed(
        redis_url: str, start_gateway: Callable[..., GatewayProcess]) -> None:
    parts = urlsplit(redis_url)
    with_password = f"redis://:{SECRET}@{parts.hostname}:{parts.port}/0"
    gateway = start_gateway(with_password, "--log-level", "debug")
    # (This Redis has no password: redis-py's AUTH is accepted or ignored, requests run.)
    answers = [httpx.post(f"{gateway.url}/v1/completions", timeout=30,
                          json={"model": MODEL, "prompt": "hi"}),
               httpx.get(f"{gateway.url}/health", timeout=10),
               httpx.get(f"{gateway.url}/v1/models", timeout=10)]
    assert not [a.text for a in answers if SECRET in a.text]
    gateway.stop()
    log = gateway.tail(100_000)
    assert "serving http://" in log
    assert SECRET not in log
    assert ":***@" in log


def test_health_says_ok_or_not_and_nothing_else(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    port = free_port()
    gateway = start_gateway(f"redis://10.255.255.1:{port}/0")
    answer = httpx.get(f"{gateway.url}/health", timeout=10)
    assert answer.status_code == 503
    assert answer.json() == {"status": "unavailable"}
    assert str(port) not in answer.text
    assert "10.255" not in answer.text


def test_health_answers_from_redis_at_most_once_a_second(
        clean_redis_url: str, start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway(clean_redis_url)
    redis = sync_redis.Redis.from_url(clean_redis_url)
    assert httpx.get(f"{gateway.url}/health", timeout=10).json()["status"] == "ok"

    def commands() -> int:
        return int(redis.info("stats")["total_commands_processed"])

    # Let the gateway's start-up traffic (its producer's warm-up) end first.
    deadline = time.monotonic() + 20
    before = commands()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = commands()
        if now - before <= 1:  # only our own INFO
            before = now
            break
        before = now
    started = time.monotonic()
    with httpx.Client(timeout=10) as http:
        for _ in range(40):
            assert http.get(f"{gateway.url}/health").status_code == 200
    elapsed = time.monotonic() - started
    after = commands()
    redis.close()
    # One probe per second at most (plus the INFO call that reads the counter).
    assert after - before <= 1 + int(elapsed) + 1, (after - before, elapsed)


async def test_a_500_names_a_request_id_not_the_workers_exception(
        clean_redis_url: str, start_gateway: Callable[..., GatewayProcess]) -> None:
    internals = "Traceback: /srv/kvrelay/secret_module.py line 42, token=abc123"

    def fail(request: GenerateRequest) -> list[Any]:
        return [Started(seq=0, worker="fake-worker-1"),
                Failed(seq=1, code=ErrorCode.INTERNAL, message=internals)]

    redis = aioredis.Redis.from_url(clean_redis_url)
    await announce(redis, "w-1", MODEL, ttl_ms=60_000)
    worker = asyncio.create_task(serve_queue(redis, MODEL, fail))
    try:
        gateway = start_gateway(clean_redis_url)
        async with httpx.AsyncClient(timeout=30) as http:
            whole = await http.post(f"{gateway.url}/v1/completions",
                                    json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
            streamed = await http.post(f"{gateway.url}/v1/completions",
                                       json={"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                             "stream": True})
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await redis.aclose()
    assert whole.status_code == 500
    error = whole.json()["error"]
    assert error["type"] == "server_error"
    request_id = whole.headers["x-request-id"]
    assert request_id.startswith("req-")
    assert request_id in error["message"]
    assert "secret_module" not in whole.text
    assert "abc123" not in whole.text
    assert streamed.status_code == 200
    assert '"server_error"' in streamed.text
    assert "secret_module" not in streamed.text
    assert "abc123" not in streamed.text
    # The details are in the gateway's own log, under the id.
    log = gateway.tail(100_000)
    assert request_id in log
    assert "secret_module" in log


def test_api_keys_are_read_whole(tmp_path: Path, clean_redis_url: str,
                                 start_gateway: Callable[..., GatewayProcess]) -> None:
    padded = "c2stYWxpY2UtMTIzNA=="  # base64, ends in '='
    hashed = "sk-b0b#x=y/+Z9=="  # holds '#' and '=' inside
    keys = tmp_path / "keys"
    keys.write_text(f"# key=tenant\n{padded}=alice\n  {hashed}=bob  \n")
    gateway = start_gateway(clean_redis_url, "--api-keys-file", str(keys))

    def status(key: str) -> int:
        return httpx.get(f"{gateway.url}/v1/models", timeout=10,
                         headers={"Authorization": f"Bearer {key}"}).status_code

    assert status(padded) == 200
    assert status(hashed) == 200
    for cut in ("c2stYWxpY2UtMTIzNA", "c2stYWxpY2UtMTIzNA=", "sk-b0b", "sk-b0b#x"):
        assert status(cut) == 401, cut
