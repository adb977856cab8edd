"""A caller that dies mid-stream: the job's caller runs in a child process of its own
(the real SDK), reporting each chunk on its stdout, and is SIGKILLed after some chunks.
Nothing of its SDK cleans up; the job must still end (its worker runs it to the end and
finishes it) and nothing of it may outlive the retention bound.

``python -m chaos.orphan_caller URL MODEL JOB_ID OPTIONS_JSON PLACEMENT PROMPT`` is the
child; ``run_orphan`` starts and kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# The tests folder: the child imports ``chaos`` from there.
TESTS = Path(__file__).resolve().parents[1]
# How long after its first chunk a child is killed at the latest (its job may send fewer
# chunks than planned: the publisher merges a slow reader's tokens).
KILL_WITHIN_S = 1.0
# How long a child keeps retrying a start that Redis refused.
RETRY_FOR_S = 30.0
STREAM_TIMEOUT_S = 25.0


async def run_orphan(url: str, model: str, run: Any, options: dict[str, Any],
                     placement: bool) -> None:
    """Run ``run``'s caller in a child process and SIGKILL it after ``at_chunk`` chunks
    (or ``KILL_WITHIN_S`` after its first); fills ``run`` with what it was shown. Its
    outcome is ``killed``, or what the child reported when it ended first."""
    from chaos.workload import Chunk

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "chaos.orphan_caller", url, model, run.job_id,
        json.dumps(options), "1" if placement else "0", run.plan.prompt,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert child.stdout is not None
    first_at: float | None = None
    other: list[str] = []
    ended = False  # the child ended on its own (said nothing of an outcome: it crashed)
    try:
        while True:
            timeout = None if first_at is None else max(0.0, first_at + KILL_WITHIN_S
                                                        - time.monotonic())
            try:
                line = await asyncio.wait_for(child.stdout.readline(), timeout)
            except TimeoutError:
                break
            if not line:
                ended = True
                break
            kind, _, rest = line.decode(errors="replace").strip().partition(" ")
            if kind == "enqueued":
                enqueued, deadline = json.loads(rest)
                run.enqueued_at, run.queue_deadline = enqueued, deadline
                run.live = True
            elif kind == "chunk":
                seq, index, tokens = json.loads(rest)
                run.chunks.append(Chunk(seq, index, tuple(tokens), time.time()))
                first_at = first_at or time.monotonic()
                if len(run.chunks) >= max(1, run.plan.at_chunk):
                    break
            elif kind == "done":
                run.outcome = "completed"
                return
            elif kind == "error":
                run.outcome, _, run.error = rest.partition(" ")
                return
            else:
                other.append(line.decode(errors="replace").rstrip())
        run.outcome = "caller crashed" if ended else "killed"
        run.error = " | ".join(other[-3:])
    finally:
        run.live = False
        run.ended_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            child.kill()  # SIGKILL: nothing of the SDK cleans up
        await child.wait()
        if run.outcome == "not run":
            run.outcome, run.error = "never started", " | ".join(other[-3:])


async def _child(url: str, model: str, job_id: str, options: dict[str, Any], placement: bool,
                 prompt: str) -> None:
    import redis

    from kvrelay import AsyncClient
    from kvrelay.errors import InvalidRequest, KvrelayError

    client = AsyncClient(url, model=model, require_worker=False, placement=placement,
                         stream_timeout=STREAM_TIMEOUT_S, reconnect_timeout=30.0)
    give_up = time.monotonic() + RETRY_FOR_S
    connected = False
    while True:  # a careful caller: what Redis refused before the job ran is tried again
        try:
            if not connected:
                await client.connect()
                connected = True
            stream = client.stream(prompt, job_id=job_id, **options)
            await stream.start()
            break
        except InvalidRequest as exc:
            print(f"error {type(exc).__name__} {exc}", flush=True)
            return
        except (KvrelayError, redis.RedisError, OSError) as exc:
            if time.monotonic() > give_up:
                print(f"error {type(exc).__name__} {exc}", flush=True)
                return
            await asyncio.sleep(0.25)
    request = stream.request
    assert request is not None
    print(f"enqueued {json.dumps([request.enqueued_at, request.queue_deadline])}", flush=True)
    try:
        async with stream:
            async for chunk in stream:
                print(f"chunk {json.dumps([chunk.seq, chunk.index, list(chunk.token_ids)])}",
                      flush=True)
    except Exception as exc:  # the outcome, reported
        print(f"error {type(exc).__name__} {exc}", flush=True)
        return
    print("done", flush=True)


if __name__ == "__main__":
    url, model, job_id, options_json, placement, prompt = sys.argv[1:7]
    asyncio.run(_child(url, model, job_id, json.loads(options_json), placement == "1", prompt))
