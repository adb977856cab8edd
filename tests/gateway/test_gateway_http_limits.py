"""What one HTTP caller can cost the gateway is bounded: body size (checked while reading),
head and body deadlines, head size, JSON nesting, connections, keep-alive. Every refusal
is OpenAI's error JSON.

Real ``kvrelay gateway`` processes on a real Redis, spoken to over raw sockets where a
well-behaved client library would not misbehave as needed.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture
def start_gateway(tmp_path: Path,
                  clean_redis_url: str) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(config: str | None = None) -> GatewayProcess:
        args: list[str] = []
        if config is not None:
            path = tmp_path / f"gateway-{len(started)}.toml"
            path.write_text(config)
            args = ["--config", str(path)]
        gateway = GatewayProcess(clean_redis_url, tmp_path, f"gateway-{len(started)}", *args)
        started.append(gateway)
        return gateway.start()

    yield start
    for gateway in started:
        gateway.stop()


def rss_bytes(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def big_body(size: int) -> Iterator[bytes]:
    """A JSON completion request ``size`` bytes long, in 1 MiB pieces."""
    head = b'{"model": "m", "prompt": "'
    tail = b'"}'
    yield head
    left = size - len(head) - len(tail)
    while left > 0:
        piece = min(left, MiB)
        yield b"a" * piece
        left -= piece
    yield tail


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_200_mb_body_gets_413_and_is_never_held(
        start_gateway: Callable[..., GatewayProcess], declared: bool) -> None:
    gateway = start_gateway()
    url = f"{gateway.url}/v1/completions"
    httpx.post(url, json={"model": "m", "prompt": "warm up"}, timeout=30)
    before = rss_bytes(gateway)
    size = 200 * MiB
    headers = {"content-type": "application/json"}
    if declared:
        headers["content-length"] = str(size)
    response = httpx.post(url, content=big_body(size), headers=headers, timeout=120)
    error = error_of(response, 413)
    assert error["code"] == "request_too_large"
    grown = rss_bytes(gateway) - before
    assert grown < 64 * MiB, f"the gateway's RSS grew by {grown / MiB:.0f} MiB"
    # The connection it came on was not needed for the next caller.
    assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200


def test_deep_json_is_refused_before_parsing(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway()
    url = f"{gateway.url}/v1/completions"
    very_deep = b'{"model": "m", "prompt": "hi", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert error_of(httpx.post(url, content=very_deep, timeout=30), 400)
    # Deeper than the limit (32) though well within what a parser would take: refused too,
    # while brackets inside strings count for nothing.
    nested = {"model": "m", "prompt": "[[[[" * 100, "x": json.loads("[" * 40 + "]" * 40)}
    error = error_of(httpx.post(url, json=nested, timeout=30), 400)
    assert "nests deeper than 32" in error["message"]
    # (a field that takes any JSON: an unknown one would be refused, 400, for its name)
    shallow = {"model": "m", "prompt": "[[[[" * 100,
               "guided_json": {"x": json.loads("[" * 20 + "]" * 20)}}
    assert httpx.post(url, json=shallow, timeout=30).status_code == 503  # no worker yet


def _connect(gateway: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    sock.settimeout(10)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_stalled_half_sent_requests_are_timed_out_and_do_not_block_health(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway("[limits]\nhead_timeout = 1.5\nbody_timeout = 1.5\n")
    stalled: list[tuple[str, socket.socket]] = []
    for i in range(64):
        sock = _connect(gateway)
        if i % 2:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            stalled.append(("head", sock))
        else:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"mo")
            stalled.append(("body", sock))
    started = time.monotonic()
    assert httpx.get(f"{gateway.url}/health", timeout=2).status_code == 200
    assert time.monotonic() - started < 2
    for part, sock in stalled:
        with sock:
            answer = _answer(sock)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), (part, answer)
        assert json.loads(body)["error"]["code"] == "request_timeout"


def test_an_oversized_head_gets_431(start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway()
    response = httpx.get(f"{gateway.url}/health", headers={"x-padding": "a" * (32 << 10)},
                         timeout=10)
    assert error_of(response, 431)["code"] == "headers_too_large"
    assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200


def test_connections_past_the_limit_are_refused_and_idle_ones_closed(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway("[limits]\nmax_connections = 8\nkeep_alive_timeout = 1\n")
    idle = [_connect(gateway) for _ in range(8)]
    time.sleep(0.3)
    try:
        assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 503
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    # A keep-alive connection left idle is closed after keep_alive_timeout.
    with _connect(gateway) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        answer = _answer(sock)
        assert answer.startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 3
