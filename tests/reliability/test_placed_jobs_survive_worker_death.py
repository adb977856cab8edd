"""Jobs waiting in a worker's own queue survive its SIGKILL: all complete on another worker.

Worker ``first`` (concurrency 1) serves a prompt prefix, then a long job with that prefix,
so the jobs placed on it behind the long one wait in its own queue (checked in Redis).
It is SIGKILLed; a second worker already running takes the long job over through its
lease and, once the dead worker's heartbeat has expired, its watchdog moves the waiting
jobs to the shared queue: every one of them completes, on the second worker.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import redis
from helpers.placement_wait import wait_advertised
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Completion
from kvrelay.keys import Keyspace
from kvrelay.prefix_fingerprints import CHUNK_TOKENS, prompt_fingerprints

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = Keyspace()
MODEL = "llama-mqa"
WAITING = 5
LONG_TOKENS = 250  # keeps the one slot busy while the others are placed behind it
LEASES = {"lease_ttl": 2.0, "lease_refresh": 0.5, "watchdog_interval": 0.5}


def _pid(completion: Completion) -> int:
    assert completion.worker is not None
    return int(completion.worker.split(":")[1])


@pytest.mark.timeout(300)
async def test_jobs_in_a_killed_workers_own_queue_complete_elsewhere(
    start_worker: Callable[..., WorkerProcess], clean_redis_url: str
) -> None:
    url = clean_redis_url
    rng = random.Random(14)
    prefix = [rng.randrange(100, 40_000) for _ in range(3 * CHUNK_TOKENS)]
    first = start_worker("first", concurrency=1, **LEASES)
    info = first.info()
    assert info is not None
    first_id = str(info["worker_id"])
    # A cap the one-slot worker stays under with the long job and the waiting ones.
    async with AsyncClient(url, model=MODEL, stream_timeout=300, placement=True,
                           placement_load_cap=float(WAITING + 2)) as client:
        seed = await client.generate(prompt_token_ids=[*prefix, 1, 2], max_tokens=2,
                                     temperature=0.0, ignore_eos=True)
        assert _pid(seed) == first.pid
        second = start_worker("second", concurrency=4, **LEASES)
        await wait_advertised(url, first_id, prompt_fingerprints(model=MODEL,
                                                                 prompt_token_ids=prefix))

        long = client.stream(prompt_token_ids=prefix + [3] * 5, max_tokens=LONG_TOKENS,
                             temperature=0.0, ignore_eos=True)
        await long.start()
        await long.__anext__()
        waiting = [asyncio.create_task(client.generate(
            prompt_token_ids=prefix + [50 + n] * 9, max_tokens=4, temperature=0.0,
            ignore_eos=True)) for n in range(WAITING)]
        own_queue = KEYS.worker_queue(MODEL, first_id)
        check = redis.Redis.from_url(url)
        try:
            deadline = asyncio.get_running_loop().time() + 30
            while check.llen(own_queue) < WAITING:
                assert asyncio.get_running_loop().time() < deadline, check.llen(own_queue)
                await asyncio.sleep(0.05)
            assert check.llen(KEYS.queue(MODEL)) == 0
            assert not any(task.done() for task in waiting)

            first.kill()

            done = await asyncio.wait_for(asyncio.gather(*waiting), 120)
            assert all(_pid(completion) == second.pid for completion in done)
            assert all(len(completion.token_ids) == 4 for completion in done)
            assert all(completion.attempts == 1 for completion in done)
            assert check.llen(own_queue) == 0
            resumed = await asyncio.wait_for(long.final(), 240)
            assert _pid(resumed) == second.pid
            assert len(resumed.token_ids) == LONG_TOKENS
        finally:
            check.close()
