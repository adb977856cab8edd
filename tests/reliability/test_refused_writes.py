"""Redis refuses every write for seconds while streams run: nothing is lost, no one dies.

Real processes: a primary under ``min-replicas-to-write 1`` with one replica, a Celery
worker serving SmolLM2, the SDK. After the streams are under way the replica is stopped
for eight seconds, so every write the worker makes (its batches, its leases, Celery's own
pops and acks) answers ``NOREPLICAS``; or the primary's snapshots fail (``MISCONF``).
Every stream must then complete with contiguous seqs and exactly transformers' greedy
tokens, every job claimed once, and the worker still running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.hf_reference import hf_greedy, load_hf_model, random_prompts
from helpers.refusing_redis import ReplicatedPrimary
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient
from kvrelay.keys import Keyspace

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "smollm2-135m-instruct"
STREAMS = 4
MAX_TOKENS = 160
REFUSED_S = 8.0


@pytest.fixture(scope="module")
def greedy_reference(smollm2_folder: Path) -> tuple[list[list[int]], list[list[int]]]:
    prompts = random_prompts([12, 9, 15, 7], seed=30)
    return prompts, hf_greedy(load_hf_model(smollm2_folder), prompts, MAX_TOKENS)


async def _stream(client: AsyncClient, prompt: list[int], tokens: list[int],
                  seqs: list[int], ids: list[str]) -> None:
    async with client.stream(prompt_token_ids=prompt, max_tokens=MAX_TOKENS,
                             temperature=0.0, ignore_eos=True) as stream:
        ids.append(stream.job_id)
        async for chunk in stream:
            seqs.append(chunk.seq)
            tokens.extend(chunk.token_ids)


async def _run(url: str, prompts: list[list[int]], fault: Callable[[], None],
               heal: Callable[[], None]) -> tuple[list[list[int]], list[list[int]], list[str]]:
    tokens: list[list[int]] = [[] for _ in prompts]
    seqs: list[list[int]] = [[] for _ in prompts]
    ids: list[str] = []
    async with AsyncClient(url, model=MODEL, stream_timeout=120,
                           reconnect_timeout=60) as client:
        tasks = [asyncio.create_task(_stream(client, p, tokens[i], seqs[i], ids))
                 for i, p in enumerate(prompts)]
        deadline = time.monotonic() + 120
        while min(len(t) for t in tokens) < 20:
            assert time.monotonic() < deadline, "the streams never got going"
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            await asyncio.sleep(0.02)
        await asyncio.to_thread(fault)
        await asyncio.sleep(REFUSED_S)
        at_heal = [len(t) for t in tokens]
        await asyncio.to_thread(heal)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)
    assert min(at_heal) < MAX_TOKENS, "the streams ended before the fault was healed"
    return tokens, seqs, ids


@pytest.mark.parametrize("refusal", ["noreplicas", "misconf"])
def test_streams_survive_seconds_of_refused_writes(
        refusal: str, primary: ReplicatedPrimary, smollm2_folder: Path, tmp_path: Path,
        greedy_reference: tuple[list[list[int]], list[list[int]]]) -> None:
    prompts, expected = greedy_reference
    fault, heal = {
        "noreplicas": (primary.stop_replica, primary.resume_replica),
        "misconf": (primary.misconf, primary.heal_misconf),
    }[refusal]
    worker = WorkerProcess("refused", primary.url, MODEL, tmp_path, concurrency=8)
    worker.start()
    try:
        worker.wait_ready(timeout=180)
        tokens, seqs, ids = asyncio.run(_run(primary.url, prompts, fault, heal))
        for i in range(STREAMS):
            assert seqs[i] == list(range(seqs[i][0], seqs[i][0] + len(seqs[i]))), ids[i]
            assert tokens[i] == expected[i], f"stream {i} differs from greedy"
        keys = Keyspace()
        with primary.client() as client:
            for job in ids:
                assert client.hget(keys.job_record(job), "attempts") == b"1", job
        assert worker.alive(), "the worker died of refused writes"
        assert "Unrecoverable error" not in worker.tail(10_000_000)
    except BaseException:
        print(f"\n----- worker log -----\n{worker.tail(8000)}")
        raise
    finally:
        worker.stop()


def test_sdk_calls_made_while_writes_are_refused_complete_once_they_are_taken(
        primary: ReplicatedPrimary) -> None:
    """A reserve, an enqueue and a cancel meet NOREPLICAS; each waits it out (up to the
    client's reconnect_timeout) instead of raising at once, and each is written."""
    keys = Keyspace()

    async def run() -> str:
        async with AsyncClient(primary.url, model=MODEL, require_worker=False,
                               reconnect_timeout=30) as client:
            await asyncio.to_thread(primary.stop_replica)
            cancel = asyncio.create_task(client.cancel("an-old-job"))
            stream = client.stream(prompt_token_ids=[1, 2, 3], max_tokens=4)
            started = asyncio.create_task(stream.__aenter__())
            await asyncio.sleep(3.0)
            assert not cancel.done()
            assert not started.done()
            await asyncio.to_thread(primary.resume_replica)
            await asyncio.wait_for(cancel, 30)
            await asyncio.wait_for(started, 30)
            job_id = stream.job_id
            await stream.__aexit__(None, None, None)
            return job_id

    job_id = asyncio.run(run())
    with primary.client() as client:
        assert client.exists(keys.abort_flag("an-old-job"))
        assert client.hget(keys.job_record(job_id), "digest") is not None
