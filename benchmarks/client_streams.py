"""Client fan-out benchmark: N concurrent streams from one process, event-loop stalls.

A fake worker *process* consumes the Celery queue and, every ``--step-ms``, publishes one
``Tokens`` event for every job it holds in one pipeline (XADD + PUBLISH per job), the
way a real worker's publisher thread does per engine step. The client process runs N
streams at once (real Celery enqueue, real subscriber) while a monitor task measures how
late a 5 ms sleep wakes up: the event loop's stalls.

    python benchmarks/client_streams.py --redis redis://127.0.0.1:6379/15 --streams 1000

The database named by ``--redis`` is emptied (FLUSHDB) first: give it a scratch one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from kvrelay import AsyncClient, keys
from kvrelay.protocol import (
    Finished,
    Started,
    Tokens,
    Usage,
    encode_event,
    log_entry_id,
    payload_to_request,
)

MODEL = "bench-model"


def fake_worker(url: str, tokens: int, step_ms: float, expected: int) -> None:
    """Consume jobs; each step emit one token per held job in a single pipeline."""
    import base64

    r = redis.Redis.from_url(url)
    jobs: dict[str, int] = {}  # job id -> next seq
    finished = 0
    step = step_ms / 1000.0
    while finished < expected:
        started = time.perf_counter()
        # Take whatever is queued (non-blocking pops), like a worker with free slots.
        while True:
            item = r.rpop(keys.queue(MODEL))
            if item is None:
                break
            message = json.loads(item)
            body = base64.b64decode(message["body"])
            request = payload_to_request(json.loads(body)[0][0])
            jobs[request.job_id] = 0
        pipe = r.pipeline(transaction=False)
        done: list[str] = []
        for job, seq in jobs.items():
            if seq == 0:
                event: Any = Started(seq=0, worker="bench", prompt_tokens=4)
            elif seq <= tokens:
                event = Tokens(seq=seq, token_ids=[seq], text=f" t{seq}")
            else:
                event = Finished(
                    seq=seq,
                    finish_reason="length",
                    finish_reasons=["length"],
                    usage=Usage(prompt_tokens=4, completion_tokens=tokens),
                )
                done.append(job)
            data = encode_event(event)
            pipe.xadd(keys.event_log(job), {"e": data}, id=log_entry_id(seq))
            pipe.publish(keys.events_channel(job), data)
            jobs[job] = seq + 1
        if len(pipe):
            pipe.execute()
        for job in done:
            del jobs[job]
            finished += 1
        spent = time.perf_counter() - started
        if spent < step:
            time.sleep(step - spent)
    r.close()


async def monitor(stop: asyncio.Event, lateness: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.005)
        lateness.append(loop.time() - t - 0.005)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = redis.Redis.from_url(args.redis)
    r.flushdb()
    r.close()
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(
        target=fake_worker, args=(args.redis, args.tokens, args.step_ms, args.streams)
    )
    worker.start()
    lateness: list[float] = []
    stop = asyncio.Event()
    async with AsyncClient(
        args.redis, model=MODEL, require_worker=False, enqueue_threads=args.enqueue_threads
    ) as client:
        await asyncio.sleep(0.5)  # let the producer warm up
        mon = asyncio.create_task(monitor(stop, lateness))
        ttft: list[float] = []
        t0 = time.perf_counter()

        async def one(i: int) -> int:
            start = time.perf_counter()
            count = 0
            async with client.stream(f"p{i}", max_tokens=args.tokens) as stream:
                async for _chunk in stream:
                    if count == 0:
                        ttft.append(time.perf_counter() - start)
                    count += 1
            return count

        counts = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(args.streams))), args.timeout
        )
        elapsed = time.perf_counter() - t0
        stop.set()
        await mon
        messages = client.dispatcher.messages
    worker.join(timeout=10)
    assert all(c == args.tokens for c in counts), "lost tokens"
    lateness.sort()
    return {
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        "step_ms": args.step_ms,
        "elapsed_s": round(elapsed, 3),
        "events_per_s": round(messages / elapsed),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_max_ms": round(max(ttft) * 1000, 1),
        "stall_p50_ms": round(lateness[len(lateness) // 2] * 1000, 2),
        "stall_p99_ms": round(lateness[int(len(lateness) * 0.99)] * 1000, 2),
        "stall_max_ms": round(lateness[-1] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--enqueue-threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", default="benchmarks/results/client_streams.json")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
