"""A Sentinel failover never looks like "no such model".

The served-model precheck reads the worker registry. A worker's heartbeat expires unless
refreshed, and during a failover nobody can refresh it: the new primary holds it as it
was replicated, expires it, and lacks it until the worker, reconnected, writes its next
one there. Calls made then were refused with ``UnknownModel`` (the gateway's 404) while
the worker was alive. Now the precheck answers from the registry it read before the
failover, and a model nobody serves is still refused at once when nothing is failing
over.

Real processes: a primary, its replica and three sentinels, one real worker process
(the simulated engine). The window is made certain: the worker is stopped (SIGSTOP) at
the moment the primary is killed (SIGKILL), the sentinels wait longer than a heartbeat
lives before they promote the replica, and the worker goes on (SIGCONT) only once the
calls have read the new primary's registry.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.sentinel_cluster import SentinelCluster
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, UnknownModel

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "simulated"
CALLS = 6
# Longer than a heartbeat lives (3 s): the promoted replica has let it expire.
DOWN_AFTER_MS = 4000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    cluster = SentinelCluster(tmp_path, down_after_ms=DOWN_AFTER_MS).start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def _refused_within(client: AsyncClient, seconds: float) -> float:
    """How long a call for a model nobody serves took to be refused (at most ``seconds``)."""
    started = time.monotonic()
    with pytest.raises(UnknownModel, match="no-such-model"):
        await asyncio.wait_for(client.generate("hi", model="no-such-model", max_tokens=2),
                               seconds)
    return time.monotonic() - started


async def _switched(cluster: SentinelCluster, old: int) -> None:
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(cluster.primary_port) == old:
        assert time.monotonic() < deadline, "the sentinels never failed over"
        await asyncio.sleep(0.2)


async def test_calls_made_during_a_failover_find_their_model(
        cluster: SentinelCluster, tmp_path: Path) -> None:
    worker = WorkerProcess("known", cluster.url, MODEL, tmp_path, concurrency=CALLS).start()
    try:
        worker.wait_ready()
        async with AsyncClient(cluster.url, model=MODEL, stream_timeout=90) as client:
            assert (await client.generate("hi", max_tokens=2)).text  # the model is served
            assert await _refused_within(client, 2.0) < 2.0  # nothing failing over: at once
            await asyncio.sleep(1.5)  # the registry's answer is read again from now on
            old = await asyncio.to_thread(cluster.primary_port)
            worker.signal(signal.SIGSTOP)  # it cannot announce itself anywhere for now
            cluster.kill_primary()
            calls = [asyncio.create_task(client.generate("hi", max_tokens=4))
                     for _ in range(CALLS)]
            await _switched(cluster, old)
            # The calls read the new primary's registry as soon as it answers (they try
            # again at most every 0.5 s): the worker's heartbeat is not there.
            await asyncio.sleep(2.0)
            refused = [c.exception() for c in calls if c.done() and c.exception()]
            worker.signal(signal.SIGCONT)
            assert not refused, f"calls refused during the failover: {refused}"
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True),
                                             120)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, failures
        assert all(r.text for r in results if not isinstance(r, BaseException))
        # A client that saw no failover refuses an unknown model at once.
        async with AsyncClient(cluster.url, model=MODEL) as fresh:
            assert await _refused_within(fresh, 2.0) < 2.0
        assert worker.alive()
    except BaseException:
        print(f"\n----- worker log -----\n{worker.tail(6000)}")
        raise
    finally:
        worker.signal(signal.SIGCONT)
        worker.stop()
