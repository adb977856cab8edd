"""A caller whose connection drops mid-stream resumes from its last seq: nothing lost, nothing twice.

The first caller is a separate process killed after a few chunks (its connection dies with
it, and it never gets to abort the job); a new client then ``resume``s from the last seq
it printed. A second test cuts the live client's subscriber connection from the server
side and lets the client reconnect and fill the gap by itself.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import pytest
import redis
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Client

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
JOB = {"prompt_token_ids": [61, 62, 63], "max_tokens": 800, "temperature": 0.0,
       "ignore_eos": True}

_CALLER = """
import json, sys
from kvrelay import Client
with Client(sys.argv[1], model=sys.argv[2]) as client:
    with client.stream(**json.loads(sys.argv[3])) as stream:
        print(json.dumps({"job_id": stream.job_id}), flush=True)
        for chunk in stream:
            print(json.dumps({"seq": chunk.seq, "ids": chunk.token_ids}), flush=True)
"""


def test_resume_after_the_caller_died(start_worker: Callable[..., WorkerProcess],
                                      clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    with Client(clean_redis_url, model=MODEL) as client:
        reference = client.generate(**JOB).token_ids
    caller = subprocess.Popen([sys.executable, "-c", _CALLER, clean_redis_url, MODEL,
                               json.dumps(JOB)], stdout=subprocess.PIPE, text=True)
    assert caller.stdout is not None
    job_id = json.loads(caller.stdout.readline())["job_id"]
    seen: list[int] = []
    last_seq = -1
    while last_seq < 10:
        line = json.loads(caller.stdout.readline())
        assert line["seq"] == last_seq + 1 or last_seq == -1
        last_seq = line["seq"]
        seen.extend(line["ids"])
    caller.kill()
    caller.wait(10)
    with Client(clean_redis_url, model=MODEL) as client:
        stream = client.resume(job_id, after_seq=last_seq)
        seqs = []
        rest: list[int] = []
        for chunk in stream:
            seqs.append(chunk.seq)
            rest.extend(chunk.token_ids)
        final = stream.final()
    assert seqs[0] == last_seq + 1
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert seen + rest == reference
    assert final.token_ids == reference


async def test_client_reconnects_and_fills_the_gap(start_worker: Callable[..., WorkerProcess],
                                                   clean_redis_url: str) -> None:
    start_worker(concurrency=2)
    admin = redis.Redis.from_url(clean_redis_url)
    async with AsyncClient(clean_redis_url, model=MODEL) as client:
        reference = (await client.generate(**JOB)).token_ids
        tokens: list[int] = []
        seqs: list[int] = []
        async with client.stream(**JOB) as stream:
            async for chunk in stream:
                tokens.extend(chunk.token_ids)
                seqs.append(chunk.seq)
                if len(seqs) == 10:
                    killed = await asyncio.to_thread(
                        admin.execute_command, "CLIENT", "KILL", "TYPE", "pubsub")
                    assert killed >= 1
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert tokens == reference
    admin.close()
