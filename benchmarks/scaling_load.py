"""Load generator of the scaling benchmark: one process keeping a number of SDK streams in
flight (closed loop: each finished stream starts the next job) until told to stop.

Started by ``scaling.py`` as ``python scaling_load.py '<json config>'``. It stops when a
line arrives on stdin: the measured window (``{"start", "end"}``, epoch seconds); what
arrived inside it is then printed as one JSON line: tokens, the gaps
between a stream's consecutive token events, and the enqueue-to-pickup time
(``timings.queue``) of jobs that ended in it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from kvrelay import AsyncClient
from kvrelay.errors import KvrelayError


@dataclass
class Records:
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens)
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (arrival, gap s)
    pickups: list[tuple[float, float]] = field(default_factory=list)  # (end, queue s)
    jobs: int = 0
    errors: int = 0


def max_tokens_of(stream: int, job: int, mean: int) -> int:
    """Output lengths spread over 0.5x..1.5x the mean, so jobs do not end in waves."""
    return max(1, int(mean * (0.5 + ((stream * 7919 + job * 104_729) % 101) / 100)))


def prompt_of(stream: int, job: int, tokens: int) -> str:
    """About ``tokens`` tokens of the simulated tokenizer (4 bytes each), unique per job."""
    head = f"stream {stream} job {job}: "
    return head + "x" * max(0, tokens * 4 - len(head))


async def _stream_loop(client: AsyncClient, index: int, config: dict[str, Any],
                       records: Records, stopping: asyncio.Event) -> None:
    job = 0
    while not stopping.is_set():
        job += 1
        last: float | None = None
        try:
            async with client.stream(prompt=prompt_of(index, job, config["prompt_tokens"]),
                                     max_tokens=max_tokens_of(index, job,
                                                              config["max_tokens"])) as stream:
                async for chunk in stream:
                    now = time.time()
                    records.chunks.append((now, len(chunk.token_ids)))
                    if last is not None:
                        records.gaps.append((now, now - last))
                    last = now
                    if stopping.is_set():
                        return  # leaving the stream aborts its job
                final = await stream.final()
            records.pickups.append((time.time(), final.timings.queue))
            records.jobs += 1
        except KvrelayError:
            records.errors += 1
            await asyncio.sleep(0.1)


async def _wait_for_window(stopping: asyncio.Event) -> dict[str, float]:
    """Block (in a thread) until the parent writes the measured window on stdin."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stopping.set()
    window: dict[str, float] = json.loads(line)
    return window


async def drive(config: dict[str, Any]) -> dict[str, Any]:
    records = Records()
    stopping = asyncio.Event()
    async with AsyncClient(config["redis_url"], model=config["model"]) as client:
        loops = [asyncio.create_task(_stream_loop(client, config["first_index"] + i, config,
                                                  records, stopping))
                 for i in range(config["streams"])]
        window = await _wait_for_window(stopping)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    start, end = window["start"], window["end"]

    def inside(t: float) -> bool:
        return start <= t <= end

    return {
        "tokens": sum(n for t, n in records.chunks if inside(t)),
        "gaps_s": [g for t, g in records.gaps if inside(t)],
        "pickups_s": [q for t, q in records.pickups if inside(t)],
        "jobs_in_window": sum(1 for t, _ in records.pickups if inside(t)),
        "jobs": records.jobs,
        "errors": records.errors,
        "cpu_s": time.process_time(),
        "pid": os.getpid(),
    }


def main() -> None:
    config = json.loads(sys.argv[1])
    result = asyncio.run(drive(config))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
