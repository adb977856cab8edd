"""Every error status, each caused for real, in OpenAI's error JSON; SSE framing byte by byte.

A tiny random model serves (``llama-mqa``); the gateway is a real ``kvrelay gateway`` process.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.gateway_process import GatewayProcess, free_port
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
LONG = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": 3000, "temperature": 0,
        "ignore_eos": True}


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


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def test_400_bad_parameter_and_bad_json(start_worker: Callable[..., WorkerProcess],
                                        clean_redis_url: str,
                                        start_gateway: Callable[..., GatewayProcess]) -> None:
    start_worker(concurrency=2)
    gateway = start_gateway(clean_redis_url)
    url = f"{gateway.url}/v1/chat/completions"
    bad = httpx.post(url, json={"model": MODEL, "temperature": -1,
                                "messages": [{"role": "user", "content": "hi"}]})
    assert "temperature" in error_of(bad, 400)["message"]
    typed = httpx.post(url, json={"model": MODEL, "messages": "hi"})
    assert error_of(typed, 400)["param"] == "messages"
    broken = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert "JSON" in error_of(broken, 400)["message"]
    vocab = httpx.post(f"{gateway.url}/v1/completions",
                       json={"model": MODEL, "prompt": [10**7], "max_tokens": 2})
    assert "vocabulary" in error_of(vocab, 400)["message"]  # refused by the worker


def test_401_without_a_valid_key(start_worker: Callable[..., WorkerProcess],
                                 clean_redis_url: str, tmp_path: Path,
                                 start_gateway: Callable[..., GatewayProcess]) -> None:
    start_worker(concurrency=2)
    keys = tmp_path / "keys"
    keys.write_text("# key=tenant\nsk-alice=alice\n")
    gateway = start_gateway(clean_redis_url, "--api-keys-file", str(keys))
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    url = f"{gateway.url}/v1/completions"
    assert error_of(httpx.post(url, json=body), 401)["code"] == "invalid_api_key"
    wrong = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-bob"})
    assert error_of(wrong, 401)["type"] == "authentication_error"
    assert error_of(httpx.get(f"{gateway.url}/v1/models"), 401)
    right = httpx.post(url, json=body, headers={"Authorization": "Bearer sk-alice"}, timeout=60)
    assert right.status_code == 200, right.text
    assert right.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_404_unknown_model_and_503_no_worker(start_worker: Callable[..., WorkerProcess],
                                            clean_redis_url: str,
                                            start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway(clean_redis_url)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    url = f"{gateway.url}/v1/completions"
    assert error_of(httpx.post(url, json=body), 503)["code"] == "no_worker"
    start_worker(concurrency=2)
    unknown = httpx.post(url, json={**body, "model": "no-such-model"})
    error = error_of(unknown, 404)
    assert error["code"] == "model_not_found"
    assert MODEL in error["message"]


def test_503_redis_unreachable(tmp_path: Path,
                               start_gateway: Callable[..., GatewayProcess]) -> None:
    # Requests wait out an unreachable Redis for the gateway's reconnect timeout (30 s by
    # default), then answer 503: with 1 s set, the answer comes long before 30 s.
    gateway = start_gateway(f"redis://127.0.0.1:{free_port()}/0",
                            KVRELAY_GATEWAY_RECONNECT_TIMEOUT="1")
    started = time.monotonic()
    response = httpx.post(f"{gateway.url}/v1/completions",
                          json={"model": MODEL, "prompt": "hi"}, timeout=60)
    assert error_of(response, 503)["code"] == "broker_unavailable"
    assert time.monotonic() - started < 20, "the gateway ignored its reconnect timeout"
    assert httpx.get(f"{gateway.url}/health").status_code == 503


async def test_429_queue_full_with_retry_after(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        start_gateway: Callable[..., GatewayProcess]) -> None:
    start_worker(concurrency=1)
    gateway = start_gateway(clean_redis_url, "--max-queue", "0")
    async with AsyncClient(clean_redis_url, model=MODEL) as sdk:
        # One job runs, one may be prefetched: the rest wait in the queue.
        streams = [sdk.stream(prompt_token_ids=[3, 4], max_tokens=3000, ignore_eos=True)
                   for _ in range(4)]
        for stream in streams:
            await stream.start()
        for _ in range(100):
            if await sdk.queue_length() > 0:
                break
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{gateway.url}/v1/completions",
                                       json={"model": MODEL, "prompt": "hi"})
        error = error_of(response, 429)
        assert error["type"] == "rate_limit_error"
        assert int(response.headers["retry-after"]) >= 1
        for stream in streams:
            await stream.aclose()


def test_504_deadline_whole_and_mid_stream(start_worker: Callable[..., WorkerProcess],
                                           clean_redis_url: str,
                                           start_gateway: Callable[..., GatewayProcess]) -> None:
    start_worker(concurrency=2)
    gateway = start_gateway(clean_redis_url, "--job-timeout", "1.0")
    url = f"{gateway.url}/v1/completions"
    assert error_of(httpx.post(url, json=LONG, timeout=60), 504)["code"] == "deadline_exceeded"
    with httpx.stream("POST", url, json={**LONG, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        body = response.read().decode()
    events = body.split("\n\n")
    assert events[-1] == ""
    last = events[-2]
    assert re.fullmatch(r'id: [0-9a-f]{12}-[0-9a-f]{32}:-?\d+\ndata: \{"error":\{.*\}\}', last)
    assert '"code":"deadline_exceeded"' in last
    assert "[DONE]" not in body  # the stream ends after the error event


def test_sse_framing_byte_by_byte(start_worker: Callable[..., WorkerProcess],
                                  clean_redis_url: str,
                                  start_gateway: Callable[..., GatewayProcess]) -> None:
    start_worker(concurrency=2)
    gateway = start_gateway(clean_redis_url)
    request = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0,
               "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=request,
                      timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["cache-control"] == "no-cache"
        raw = response.read()
    text = raw.decode()
    event = r"id: ([0-9a-f]{12}-[0-9a-f]{32}):(\d+)\ndata: (\{[^\n]*\})\n\n"
    done = r"id: ([0-9a-f]{12}-[0-9a-f]{32}):(\d+)\ndata: \[DONE\]\n\n"
    assert re.fullmatch(f"(?:{event})+{done}", text), text
    import json
    frames = re.findall(event, text)
    jobs = {job for job, _, _ in frames}
    assert len(jobs) == 1
    seqs = [int(seq) for _, seq, _ in frames]
    assert seqs == sorted(seqs)
    assert len(set(seqs[:-1])) == len(seqs) - 1
    chunks = [json.loads(data) for _, _, data in frames]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert all(c["id"] == f"cmpl-{jobs.pop()}" for c in chunks[:1])
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["choices"] == [{"index": 0, "text": "", "logprobs": None,
                                      "finish_reason": "length"}]
    done_match = re.search(done, text)
    assert done_match is not None
    assert int(done_match.group(2)) == seqs[-1]
