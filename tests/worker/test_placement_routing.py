"""Prefix-aware placement with real workers: a repeated prefix goes back to the worker that
served it (and hits its prefix cache); a busy holder, or the switch off, sends it to the
shared queue instead.

Two real Celery workers on the tiny random model. Idle workers blocked on the shared
queue take turns (Redis hands a job to the consumer that has waited longest), so without
placement consecutive jobs alternate between them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from helpers.placement_wait import wait_advertised
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Completion
from kvrelay.prefix_fingerprints import CHUNK_TOKENS, prompt_fingerprints

pytestmark = [pytest.mark.integration]

MODEL = "llama-mqa"
PREFIX_TOKENS = 3 * CHUNK_TOKENS  # 192: twelve full KV blocks of 16


def _prefix(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40_000) for _ in range(PREFIX_TOKENS)]


def _ran_on(completion: Completion, workers: list[WorkerProcess]) -> WorkerProcess:
    assert completion.worker is not None
    pid = int(completion.worker.split(":")[1])
    return next(worker for worker in workers if worker.pid == pid)


def _worker_id(worker: WorkerProcess) -> str:
    info = worker.info()
    assert info is not None
    return str(info["worker_id"])


async def _generate(client: AsyncClient, ids: list[int], max_tokens: int = 2) -> Completion:
    return await client.generate(prompt_token_ids=ids, max_tokens=max_tokens, temperature=0.0,
                                 ignore_eos=True)


@pytest.mark.timeout(300)
async def test_a_repeated_prefix_goes_back_to_the_worker_that_served_it(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    url = clean_redis_url
    workers = [start_worker("w1", concurrency=2), start_worker("w2", concurrency=2)]
    prefix = _prefix(1)
    async with AsyncClient(url, model=MODEL, stream_timeout=120, placement=True) as client:
        seed = await _generate(client, [*prefix, 5, 6, 7])
        holder = _ran_on(seed, workers)
        await wait_advertised(url, _worker_id(holder), prompt_fingerprints(
            model=MODEL, prompt_token_ids=prefix))
        for turn in range(6):
            completion = await _generate(client, prefix + [200 + turn] * (10 + turn))
            assert _ran_on(completion, workers) is holder, turn
            assert completion.usage.cached_tokens >= PREFIX_TOKENS, completion.usage
        # A prompt nobody served goes to the shared queue: both workers take such jobs.
        strangers = [_ran_on(await _generate(client, _prefix(100 + n)), workers)
                     for n in range(4)]
        assert set(strangers) == set(workers)


@pytest.mark.timeout(300)
async def test_a_busy_holder_or_the_switch_off_sends_jobs_to_the_shared_queue(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    url = clean_redis_url
    workers = [start_worker("w1", concurrency=1), start_worker("w2", concurrency=1)]
    prefix = _prefix(2)
    async with AsyncClient(url, model=MODEL, stream_timeout=300, placement=True) as client:
        seed = await _generate(client, [*prefix, 5, 6, 7])
        holder = _ran_on(seed, workers)
        other = next(worker for worker in workers if worker is not holder)
        await wait_advertised(url, _worker_id(holder), prompt_fingerprints(
            model=MODEL, prompt_token_ids=prefix))

        # Placed on the holder (idle, under the cap); it keeps the holder's one slot busy.
        # Its prompt adds a fourth chunk, which only the holder will ever hold: the other
        # worker serves the three-chunk prefix below, and among workers with equally long
        # matches the least loaded wins, so the control needs a longer match.
        longer = prefix + _prefix(3)[:CHUNK_TOKENS]
        long = client.stream(prompt_token_ids=longer + [9] * 8, max_tokens=3000,
                             temperature=0.0, ignore_eos=True)
        await long.start()
        await long.__anext__()
        holder.wait_for_stats(lambda stats: stats.get("running") == 1)
        await wait_advertised(url, _worker_id(holder), prompt_fingerprints(
            model=MODEL, prompt_token_ids=longer))

        # Over the default cap (1 x concurrency): the shared queue, so the other worker.
        busy = await _generate(client, prefix + [11] * 8)
        assert _ran_on(busy, workers) is other
        # The switch off: the shared queue too, whatever the holder's load.
        async with AsyncClient(url, model=MODEL, stream_timeout=120, placement=False,
                               placement_load_cap=10.0) as off:
            assert _ran_on(await _generate(off, prefix + [12] * 8), workers) is other
        # Control: a cap the holder is under places the job behind the long one.
        async with AsyncClient(url, model=MODEL, stream_timeout=300, placement=True,
                               placement_load_cap=10.0) as roomy:
            queued = asyncio.create_task(_generate(roomy, longer + [13] * 8))
            await asyncio.sleep(2.0)
            if queued.done():  # it should be waiting in the holder's own queue
                ran_on = _ran_on(queued.result(), workers)
                pytest.fail(f"the control job ran at once, on {ran_on.name} "
                            f"(holder {holder.name})")
            await long.aclose()  # frees the holder's slot
            placed = await asyncio.wait_for(queued, 120)
            assert _ran_on(placed, workers) is holder
            assert placed.usage.cached_tokens >= len(longer)
