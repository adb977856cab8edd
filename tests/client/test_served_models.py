"""``ServedModels``: what the served-model precheck answers around a failover.

The registry reads are played by a list of answers (each a set of models, or an error
Redis gives while failing over), fed through the same ``update``/``unreachable`` calls
``JobLifecycle.workers`` makes; ``require`` itself runs unchanged. The real failover is
``tests/reliability/test_failover_keeps_models_known.py``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from kvrelay import UnknownModel, served_models
from kvrelay.served_models import ServedModels

A, B = ("10.0.0.1", 6379), ("10.0.0.2", 6379)


class Registry:
    """Answers registry reads in turn (the last one from then on)."""

    def __init__(self, *answers: frozenset[str] | Exception,
                 primary: tuple[str, int] | None = None) -> None:
        self.answers = list(answers)
        self.primary = primary
        self.reads = 0
        self.served = ServedModels(self.read, patience=3.0)

    async def read(self) -> frozenset[str]:
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            self.served.unreachable()
            raise answer
        self.served.update(answer, self.primary)
        return answer


async def _refused_in(served: ServedModels, model: str) -> float:
    started = time.monotonic()
    with pytest.raises(UnknownModel, match=repr(model)):
        await asyncio.wait_for(served.require(model), 5)
    return time.monotonic() - started


async def test_without_a_failover_an_unknown_model_is_refused_at_once() -> None:
    registry = Registry(frozenset({"m"}))
    await registry.served.require("m")
    assert await _refused_in(registry.served, "other") < 0.5


async def test_a_model_served_before_a_failover_still_is() -> None:
    registry = Registry(frozenset({"m"}), redis.ConnectionError("primary gone"),
                        frozenset())
    await registry.served.require("m")
    await asyncio.sleep(0.15)
    with pytest.raises(redis.ConnectionError):
        await registry.served.get(0.0)  # the outage (the caller's patience retries it)
    assert await registry.served.get(0.0) == frozenset()  # its heartbeat is missing
    await asyncio.wait_for(registry.served.require("m"), 1)  # answered from before
    # A model nobody served before waits for the failover, then is refused.
    assert 2.5 < await _refused_in(registry.served, "other") < 4.0


async def test_another_primary_counts_as_a_failover_and_settles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served_models, "SETTLE_S", 0.5)
    registry = Registry(frozenset({"m"}), primary=A)
    await registry.served.require("m")
    registry.answers, registry.primary = [frozenset()], B
    assert await registry.served.get(0.0) == frozenset()  # the new primary's registry
    await asyncio.wait_for(registry.served.require("m"), 1)
    # The worker announces itself on the new primary; once the registry has settled,
    # unknown models are refused at once again.
    registry.answers = [frozenset({"m"})]
    await asyncio.sleep(0.6)
    assert await _refused_in(registry.served, "other") < 0.5


async def test_a_model_announced_during_the_failover_is_found() -> None:
    registry = Registry(redis.ConnectionError("no primary yet"), frozenset())
    with pytest.raises(redis.ConnectionError):
        await registry.served.get(0.0)
    waiting = asyncio.create_task(registry.served.require("m"))  # never seen: it waits
    await asyncio.sleep(0.6)
    assert not waiting.done()
    registry.answers = [frozenset({"m"})]
    await asyncio.wait_for(waiting, 1)
