"""A dead worker's jobs are shared by the survivors by speed, not evenly.

Real Redis, three real worker processes on the simulated engine (short leases): ``fast``,
``slow`` (the same fixed step cost, 25 times the cost per prompt token: it prefills 25
times slower) and ``victim``. Many streams run on all three; once each has tokens, the
victim is SIGKILLed. Before, every survivor's consumer claimed the copies of the
victim's jobs as fast as it pulled them, whatever its speed: the slow survivor re-prefilled
about half of them, and its share set the longest pause. Now a survivor admits a copy
only while the re-prefill it holds stays within ``KVRELAY_TAKEOVER_TARGET_S`` seconds of
work at its measured prefill rate (one at a time when over it) and hands the others back
unclaimed:
the slow survivor takes at most half the fast one's share.

Every stream still completes token-identical to the simulated engine's own answer (its
tokens depend only on the prompt and the position), with no token twice or missing, and
each taken-over job ran exactly twice (a copy handed back is never claimed, so its
attempt count is not charged). The slow survivor's first two hand-back pushes are lost on
their way (an injected fault, as pushes to a primary that is then demoted; its own watch
is slowed so that every copy it sends is a hand-back): the fast survivor's lost-copy watch
pushes them again, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.injected_faults import FAST, inject
from helpers.job_log import wait_terminal
from helpers.worker_fixtures import stop_and_show_logs
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, AsyncStream
from kvrelay.protocol import TERMINAL_EVENTS, Finished, Started, Tokens
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.simulated.engine import SimulatedEngine
from kvrelay_worker.simulated.step_time import StepTimeModel

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "simulated"
STREAMS = 42
PROMPT_TOKENS = 120
MAX_TOKENS = 400
# Every stream has this many tokens when the victim dies (the slow worker's too: it has
# prefilled, so its prefill rate is measured).
KILL_AT = 5
LOST_HANDBACKS = 2
SETTINGS = FAST | {"concurrency": 32, "takeover_target_s": 0.25}
FAST_TOKEN_MS = 0.08
SLOW_TOKEN_MS = 2.0


def prompt(index: int) -> list[int]:
    return [(index * 7919 + k * 31) % 30_000 + 1 for k in range(PROMPT_TOKENS)]


def reference_tokens() -> list[list[int]]:
    """Each stream's greedy answer from the simulated engine itself, run here unpaced."""
    engine = SimulatedEngine(StepTimeModel(0.0, 0.0), max_num_seqs=STREAMS)
    for i in range(STREAMS):
        engine.add_request(str(i), prompt(i), SamplingParams(max_tokens=MAX_TOKENS))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(STREAMS)}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(t for d in out.deltas for t in d.token_ids)
    return [tokens[str(i)] for i in range(STREAMS)]


@pytest.fixture
def workers(clean_redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
            ) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(name, **settings)``: a simulated worker with ``SETTINGS`` (and faults)."""
    started: list[WorkerProcess] = []

    def start(name: str, faults: dict[str, str] | None = None, **settings: Any
              ) -> WorkerProcess:
        worker = inject(WorkerProcess(name, clean_redis_url, MODEL, tmp_path,
                                      **(SETTINGS | settings)), **(faults or {}))
        started.append(worker.start())
        return worker

    yield start
    stop_and_show_logs(started, request, 8000)


class Seen:
    """What one stream's caller received: each chunk's seq and tokens."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.tokens: list[int] = []

    async def read(self, stream: AsyncStream) -> None:
        async for chunk in stream:
            self.seqs.append(chunk.seq)
            self.tokens.extend(chunk.token_ids)


@pytest.mark.timeout(300)  # a hang guard: three workers and 42 streams on 2 shared cores
async def test_a_slow_survivor_takes_a_smaller_share_and_nothing_is_lost(
        workers: Callable[..., WorkerProcess], clean_redis_url: str) -> None:
    url = clean_redis_url
    expected = await asyncio.to_thread(reference_tokens)
    fast = workers("fast", simulated_token_ms=FAST_TOKEN_MS)
    slow = workers("slow", faults={"lose_copies": str(LOST_HANDBACKS)},
                   simulated_token_ms=SLOW_TOKEN_MS, watchdog_interval=3600)
    victim = workers("victim", simulated_token_ms=FAST_TOKEN_MS)
    for worker in (fast, slow, victim):
        await asyncio.to_thread(worker.wait_ready)
    names = {worker.pid: worker.name for worker in (fast, slow, victim)}

    async with AsyncClient(url, model=MODEL, stream_timeout=90) as client:
        streams = [client.stream(prompt_token_ids=prompt(i), max_tokens=MAX_TOKENS,
                                 ignore_eos=True, temperature=0.0) for i in range(STREAMS)]
        seen = [Seen() for _ in streams]
        for stream in streams:
            await stream.start()
        readers = [asyncio.create_task(s.read(stream)) for s, stream in zip(seen, streams,
                                                                          strict=True)]
        give_up = time.monotonic() + 120
        while min(len(s.tokens) for s in seen) < KILL_AT:
            assert time.monotonic() < give_up, [len(s.tokens) for s in seen]
            assert not any(r.done() for r in readers), "a stream ended before the kill"
            await asyncio.sleep(0.05)
        on_victim = [i for i, stream in enumerate(streams)
                     if _pid_of(stream.worker) == victim.pid]
        await asyncio.to_thread(victim.kill)
        await asyncio.wait_for(asyncio.gather(*readers), 240)
        finals = [await stream.final() for stream in streams]

    # Correctness: every stream whole and exact, each token once.
    for i, (s, final) in enumerate(zip(seen, finals, strict=True)):
        assert s.tokens == expected[i], f"stream {i}"
        assert final.token_ids == expected[i], f"stream {i}"
        assert all(a < b for a, b in zip(s.seqs, s.seqs[1:], strict=False)), f"stream {i}"
    taken_by: Counter[str] = Counter()
    for i, stream in enumerate(streams):
        events = await asyncio.to_thread(wait_terminal, url, stream.job_id, 30)
        assert [e.seq for e in events] == list(range(len(events))), f"stream {i}"
        assert sum(isinstance(e, TERMINAL_EVENTS) for e in events) == 1
        assert isinstance(events[-1], Finished)
        logged = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
        assert logged == expected[i], f"stream {i}: the log"
        runs = [e for e in events if isinstance(e, Started)]
        if i in on_victim:  # one death, one takeover: hand-backs charged no attempt
            assert [e.attempt for e in runs] == [1, 2], f"stream {i}"
            taken_by[names[_pid_of(runs[1].worker)]] += 1
        else:
            assert [e.attempt for e in runs] == [1], f"stream {i}"

    # The spread: the slow survivor took a clearly smaller share than the fast one.
    assert len(on_victim) >= 6, f"the victim ran only {len(on_victim)} streams"
    assert sum(taken_by.values()) == len(on_victim)
    assert taken_by["slow"] * 2 <= taken_by["fast"], dict(taken_by)
    # What the slow survivor gave back went on, lost pushes included.
    handed_back = slow.tail(None).count("handing back the copy of job")
    lost = slow.tail(None).count("test fault: lost job copy")
    assert handed_back >= 1
    assert lost == min(LOST_HANDBACKS, handed_back)


def _pid_of(worker: str | None) -> int:
    """The process id in a ``Started`` event's worker name (``host:pid``)."""
    assert worker is not None
    return int(worker.rsplit(":", 1)[1])
