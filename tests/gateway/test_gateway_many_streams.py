"""500 concurrent streaming requests through one gateway process all complete (tiny model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers.gateway_process import GatewayProcess
from helpers.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STREAMS = 500
TOKENS = 6


async def test_five_hundred_concurrent_streams(start_worker: Callable[..., WorkerProcess],
                                               clean_redis_url: str, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the worker's; the test process keeps its own
        start_worker("wide", concurrency=STREAMS, max_num_seqs=256)
    gateway = GatewayProcess(clean_redis_url, tmp_path).start()
    limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=300) as http:

            async def one(i: int) -> tuple[str, int, list[str]]:
                request = {"model": "llama-mqa", "prompt": [7 + i % 400, 8, 9],
                           "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
                           "stream": True, "stream_options": {"include_usage": True}}
                lines: list[str] = []
                async with http.stream("POST", f"{gateway.url}/v1/completions",
                                       json=request) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            lines.append(line[6:])
                    return lines[-1], response.status_code, lines

            results = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    finally:
        gateway.stop()
    assert [status for _, status, _ in results] == [200] * STREAMS
    assert [last for last, _, _ in results] == ["[DONE]"] * STREAMS
    for _, _, lines in results:
        assert f'"completion_tokens":{TOKENS}' in lines[-2]
    assert len({lines[0] for _, _, lines in results}) == STREAMS  # each its own job
