"""Client fan-out benchmark: N concurrent streams from one process, event-loop stalls.

The client process runs N streams at once (real Celery enqueue, real subscriber) while a
monitor task measures how late a 5 ms sleep wakes up: the event loop's stalls. The jobs
are served either by a fake worker *process* that consumes the Celery queue and, every
``--step-ms``, publishes one ``Tokens`` event for every job it holds in one pipeline, one
message per client (the way a real worker's publisher does per engine step), or, with
``--real-worker``, by a real kvrelay worker on a tiny random model (torch on one thread,
leaving the client a core).
Also reported: the client's CPU time per token, and whether every stream's ``seq`` was
contiguous.

    python benchmarks/client_streams.py --redis redis://127.0.0.1:6379/15 --streams 1000
    python benchmarks/client_streams.py --real-worker --tokens 8

The database named by ``--redis`` is emptied (FLUSHDB) first: give it a scratch one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

import redis
from harness import flush_db, print_report, tiny_worker_stack, write_result

from kvrelay import AsyncClient, event_log
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    Finished,
    Started,
    Tokens,
    Usage,
    decode_request_json,
    encode_event,
)

KEYS = Keyspace()  # the default namespace

MODEL = "bench-model"


def fake_worker(url: str, tokens: int, step_ms: float, expected: int) -> None:
    """Consume jobs; each step emit one token per held job in a single pipeline."""
    import base64

    r = redis.Redis.from_url(url)
    jobs: dict[str, int] = {}  # job id -> next seq
    replies: dict[str, str] = {}  # job id -> the channel its client listens on
    finished = 0
    step = step_ms / 1000.0
    while finished < expected:
        started = time.perf_counter()
        # Take whatever is queued (non-blocking pops), like a worker with free slots.
        while True:
            item = r.rpop(KEYS.queue(MODEL))
            if item is None:
                break
            message = json.loads(item)
            body = base64.b64decode(message["body"])
            request = decode_request_json(json.dumps(json.loads(body)[0][0]))
            jobs[request.job_id] = 0
            replies[request.job_id] = request.reply_to or KEYS.events_channel(request.job_id)
        pipe = r.pipeline(transaction=False)
        done: list[str] = []
        # Per client, the pairs of this step: one message each, as a real worker sends.
        messages: dict[str, list[bytes]] = {}
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
            events = pack_events([encode_event(event)])
            event_log.add_entry(pipe, KEYS.event_log(job), seq, events,
                                terminal=isinstance(event, Finished))
            messages.setdefault(replies[job], []).append(pack_pair(job, events))
            jobs[job] = seq + 1
        for channel, pairs in messages.items():
            pipe.publish(channel, pack_message(pairs))
        if len(pipe):
            pipe.execute()
        for job in done:
            del jobs[job]
            del replies[job]
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


async def stream_all(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Open every stream at once; measure stalls, CPU per token, seq contiguity."""
    gc_pauses: list[float] = []
    gc_started: list[float] = []

    def gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started.append(time.perf_counter())
        elif gc_started:
            gc_pauses.append(time.perf_counter() - gc_started.pop())

    gc.callbacks.append(gc_timer)
    lateness: list[float] = []
    stop = asyncio.Event()
    async with AsyncClient(
        args.redis, model=model, require_worker=False, enqueue_threads=args.enqueue_threads,
        stream_timeout=args.timeout,
    ) as client:
        await asyncio.sleep(0.5)  # let the producer warm up
        mon = asyncio.create_task(monitor(stop, lateness))
        ttft: list[float] = []
        contiguous: list[bool] = []
        cpu0, t0 = time.process_time(), time.perf_counter()

        async def one(i: int) -> int:
            start = time.perf_counter()
            tokens = 0
            seqs: list[int] = []
            async with client.stream(prompt_token_ids=[7 + i % 500, 8, 9],
                                     max_tokens=args.tokens, temperature=0.0,
                                     ignore_eos=True) as stream:
                async for chunk in stream:
                    if not seqs:
                        ttft.append(time.perf_counter() - start)
                    seqs.append(chunk.seq)
                    tokens += len(chunk.token_ids) or 1
            contiguous.append(seqs == list(range(seqs[0], seqs[0] + len(seqs))))
            return tokens

        counts = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(args.streams))), args.timeout
        )
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        stop.set()
        await mon
        messages = client.dispatcher.messages
    gc.callbacks.remove(gc_timer)
    assert all(c == args.tokens for c in counts), "lost tokens"
    lateness.sort()
    total = sum(counts)
    return {
        "worker": "real (tiny random model)" if args.real_worker else "fake",
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        "step_ms": None if args.real_worker else args.step_ms,
        "elapsed_s": round(elapsed, 3),
        "events_per_s": round(messages / elapsed),
        "all_seq_contiguous": all(contiguous),
        "client_cpu_us_per_token": round(cpu / total * 1e6, 1),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_max_ms": round(max(ttft) * 1000, 1),
        "stall_p50_ms": round(lateness[len(lateness) // 2] * 1000, 2),
        "stall_p99_ms": round(lateness[int(len(lateness) * 0.99)] * 1000, 2),
        "stall_max_ms": round(lateness[-1] * 1000, 2),
        "gc_pause_max_ms": round(max(gc_pauses, default=0.0) * 1000, 2),
    }


def run_fake(args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(
        target=fake_worker, args=(args.redis, args.tokens, args.step_ms, args.streams)
    )
    worker.start()
    try:
        return asyncio.run(stream_all(args, MODEL))
    finally:
        worker.join(timeout=10)


def run_real(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvrelay-streams-") as tmp, \
            tiny_worker_stack(args.redis, args.streams, Path(tmp)) as stack:
        return asyncio.run(stream_all(args, stack.served_model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--enqueue-threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--real-worker", action="store_true",
                        help="serve the streams with a real worker on a tiny random model")
    parser.add_argument("--out", default="benchmarks/results/client_streams.json")
    args = parser.parse_args()
    flush_db(args.redis)
    result = run_real(args) if args.real_worker else run_fake(args)
    print_report(result)
    write_result(args.out, "client_streams", args, result)


if __name__ == "__main__":
    main()
