"""The Sentinel primary dies under 16 streams, again and again: every stream completes
token-identical, calls made during the failover complete, the worker keeps running.

Real processes each round: a primary, its replica, three sentinels
(``down-after-milliseconds 1000``), one Celery worker on the simulated engine (whose
tokens depend only on the prompt and position, so the reference is computed in-process)
and the SDK over the ``redis+sentinel://`` URL. Once the streams are under way the primary
is SIGKILLed and six ``generate()`` calls are made at once, during the failover. Before
the fixes a round could stop the worker (kombu's Sentinel channel failed to restore
unacknowledged messages: ``Unrecoverable error``) and every call made during the failover
raised ``BrokerUnavailable`` at once.

Rounds: ``KVRELAY_TEST_FAILOVER_ROUNDS`` (CI runs 2; the acceptance figure is from 10).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from helpers.sentinel_cluster import SentinelCluster
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "simulated"
STREAMS = 16
CALLS_DURING_FAILOVER = 6
MAX_TOKENS = 96
ROUNDS = int(os.environ.get("KVRELAY_TEST_FAILOVER_ROUNDS", "2"))


def _prompt(index: int) -> list[int]:
    return [100 + index, 200 + index % 5, 300, 400 + index % 3]


def _reference(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    engine = SimulatedEngine(StepTimeModel(0.0, 0.0), max_num_seqs=64)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens,
                                                          temperature=0.0, ignore_eos=True))
    out: dict[int, list[int]] = {}
    while engine.has_unfinished_requests():
        for result in engine.step():
            if result.finished and result.output is not None:
                out[int(result.request_id)] = result.output.choices[0].token_ids
    return [out[i] for i in range(len(prompts))]


async def _stream(client: AsyncClient, prompt: list[int], tokens: list[int],
                  seqs: list[int]) -> None:
    async with client.stream(prompt_token_ids=prompt, max_tokens=MAX_TOKENS,
                             temperature=0.0, ignore_eos=True) as stream:
        async for chunk in stream:
            seqs.append(chunk.seq)
            tokens.extend(chunk.token_ids)


async def _round(cluster: SentinelCluster) -> tuple[list[list[int]], list[list[int]],
                                                    list[list[int]]]:
    tokens: list[list[int]] = [[] for _ in range(STREAMS)]
    seqs: list[list[int]] = [[] for _ in range(STREAMS)]
    async with AsyncClient(cluster.url, model=MODEL, stream_timeout=90,
                           reconnect_timeout=60) as client:
        tasks = [asyncio.create_task(_stream(client, _prompt(i), tokens[i], seqs[i]))
                 for i in range(STREAMS)]
        deadline = time.monotonic() + 60
        while min(len(t) for t in tokens) < 8:
            assert time.monotonic() < deadline, "the streams never got going"
            assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            await asyncio.sleep(0.02)
        await asyncio.to_thread(cluster.kill_primary)
        calls = [asyncio.create_task(client.generate(
            prompt_token_ids=_prompt(STREAMS + i), max_tokens=8, temperature=0.0,
            ignore_eos=True)) for i in range(CALLS_DURING_FAILOVER)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)
        done = await asyncio.wait_for(asyncio.gather(*calls), timeout=180)
    return tokens, seqs, [d.token_ids for d in done]


@pytest.mark.parametrize("round_index", range(ROUNDS))
def test_streams_and_calls_survive_a_primary_kill(round_index: int, tmp_path: Path) -> None:
    expected = _reference([_prompt(i) for i in range(STREAMS)], MAX_TOKENS)
    expected_calls = _reference([_prompt(STREAMS + i) for i in range(CALLS_DURING_FAILOVER)], 8)
    cluster = SentinelCluster(tmp_path / "ha", down_after_ms=1000).start()
    worker = WorkerProcess("ha", cluster.url, MODEL, tmp_path, concurrency=STREAMS + 8,
                           simulated_step_ms=25)
    try:
        worker.start().wait_ready()
        tokens, seqs, calls = asyncio.run(_round(cluster))
        for i in range(STREAMS):
            assert seqs[i] == list(range(seqs[i][0], seqs[i][0] + len(seqs[i]))), i
            assert tokens[i] == expected[i], f"stream {i} differs"
        assert calls == expected_calls
        assert worker.alive(), "the worker stopped during the failover"
        log = worker.tail(10_000_000)
        assert "Unrecoverable error" not in log
        assert "Traceback" not in log
    except BaseException:
        print(f"\n----- worker log -----\n{worker.tail(8000)}")
        raise
    finally:
        worker.stop()
        cluster.stop()
