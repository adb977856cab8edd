"""Adapters loaded and removed while the engine runs, a bounded LRU of device slots, and
requests for adapters the engine does not hold failing alone.

``max_loras=2`` slots for three adapters: the least recently used adapter no running
request holds is the one evicted; at most two adapters run at once (a third waits, the
base model never does); a removed adapter serves the requests it already accepted, then
gives its slot back. Every request's tokens are those it gets alone on a fresh engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts
from helpers.lora_adapters import RECIPES, adapter_root, build_adapter

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine
from kvrelay_worker.engine.errors import LoraAdapterError, LoraNotLoadedError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
(PROMPT,) = random_prompts([20], seed=3)
NAMES = {"a": "attn-r8", "b": "rslora-r16", "c": "mlp-r16"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def adapters(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, Path]:
    root = adapter_root(tmp_path_factory)
    return {short: build_adapter(smollm2_folder, RECIPES[name], root)
            for short, name in NAMES.items()}


def _engine(folder: Path, adapters: dict[str, Path], **options: Any) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32",
                                    max_lora_rank=16, num_kv_blocks=64,
                                    **{"max_loras": 2, **options}))
    for name, path in adapters.items():
        engine.add_lora(name, path)
    return engine


@pytest.fixture(scope="module")
def alone(smollm2_folder: Path, adapters: dict[str, Path]) -> dict[str | None, list[int]]:
    """Each adapter's (and the base model's) tokens for ``PROMPT``, one request at a time."""
    engine = _engine(smollm2_folder, adapters)
    tokens = {lora: _run(engine, {f"alone-{lora}": lora})[f"alone-{lora}"]
              for lora in (None, *NAMES)}
    assert len({tuple(t) for t in tokens.values()}) == 4
    return tokens


def _run(engine: LLMEngine, requests: dict[str, str | None]) -> dict[str, list[int]]:
    for request_id, lora in requests.items():
        engine.add_request(request_id, PROMPT, GREEDY, lora=lora)
    finals = final_outputs(run_engine(engine))
    return {rid: out.choices[0].token_ids for rid, out in finals.items()}


def test_lru_evicts_the_least_recently_used_idle_adapter(
        smollm2_folder: Path, adapters: dict[str, Path],
        alone: dict[str | None, list[int]]) -> None:
    engine = _engine(smollm2_folder, adapters)
    assert engine.loras is not None
    steps = [("a", ["a", None], 1), ("b", ["a", "b"], 2), ("a", ["a", "b"], 2),
             ("c", ["a", "c"], 3),  # b was used less recently than a
             ("b", ["b", "c"], 4), ("b", ["b", "c"], 4)]
    for i, (lora, holders, loads) in enumerate(steps):
        assert _run(engine, {f"r{i}": lora}) == {f"r{i}": alone[lora]}
        assert (engine.loras.slot_holders(), engine.loras.num_slot_loads) == (holders, loads)
    assert [(info.name, info.slot) for info in engine.list_loras()] == [
        ("a", None), ("b", 0), ("c", 1)]
    stats = engine.stats()
    assert (stats["loras_loaded"], stats["lora_slots_used"], stats["lora_slots"],
            stats["lora_slot_loads"]) == (3, 2, 2, 4)
    assert_engine_idle(engine)


def test_running_adapters_keep_their_slots_and_a_third_waits(
        smollm2_folder: Path, adapters: dict[str, Path],
        alone: dict[str | None, list[int]]) -> None:
    engine = _engine(smollm2_folder, adapters)
    scheduled: list[set[str | None]] = []
    schedule = engine.scheduler.schedule

    def recording() -> Any:
        out = schedule()
        scheduled.append({item.seq.lora.name if item.seq.lora else None
                          for item in out.scheduled})
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    requests = {"ra": "a", "rb": "b", "rc": "c", "base": None}
    assert _run(engine, requests) == {rid: alone[lora] for rid, lora in requests.items()}
    assert scheduled[0] == {"a", "b", None}  # c waits for a slot; the base never does
    assert all(len(names - {None}) <= 2 for names in scheduled)
    assert any("c" in names for names in scheduled)
    assert_engine_idle(engine)


def test_add_and_remove_while_requests_run(smollm2_folder: Path, adapters: dict[str, Path],
                                          alone: dict[str | None, list[int]]) -> None:
    engine = _engine(smollm2_folder, {"a": adapters["a"]})
    assert engine.loras is not None
    engine.add_request("ra", PROMPT, GREEDY, lora="a")
    outputs: dict[str, list[int]] = {}

    def step() -> None:
        for out in engine.step():
            if out.output is not None:
                outputs[out.request_id] = out.output.choices[0].token_ids

    step()
    step()
    engine.add_lora("b", adapters["b"])  # between two steps, while "ra" decodes
    engine.add_request("rb", PROMPT, GREEDY, lora="b")
    assert engine.remove_lora("a")
    assert not engine.remove_lora("a")
    with pytest.raises(LoraNotLoadedError, match=r"'a' is not loaded .*\(loaded: b\)"):
        engine.add_request("ra2", PROMPT, GREEDY, lora="a")
    assert [info.name for info in engine.list_loras()] == ["b"]
    while engine.has_unfinished_requests():
        step()
    assert outputs == {"ra": alone["a"], "rb": alone["b"]}  # "ra" finished with "a"
    assert _run(engine, {"base": None}) == {"base": alone[None]}
    assert engine.loras.slot_holders() == [None, "b"]  # the removed adapter let go
    assert_engine_idle(engine)


def test_a_request_for_an_unknown_adapter_fails_alone(
        smollm2_folder: Path, adapters: dict[str, Path],
        alone: dict[str | None, list[int]]) -> None:
    engine = _engine(smollm2_folder, {"a": adapters["a"]})
    engine.add_request("ra", PROMPT, GREEDY, lora="a")
    engine.add_request("base", PROMPT, GREEDY)
    engine.step()
    with pytest.raises(LoraNotLoadedError, match="'nope' is not loaded"):
        engine.add_request("bad", PROMPT, GREEDY, lora="nope")
    finals = final_outputs(run_engine(engine))
    assert {rid: out.choices[0].token_ids for rid, out in finals.items()} == {
        "ra": alone["a"], "base": alone[None]}
    assert_engine_idle(engine)


def test_lora_off_refuses_adapters_clearly(smollm2_folder: Path,
                                           adapters: dict[str, Path]) -> None:
    engine = _engine(smollm2_folder, {}, max_loras=0)
    with pytest.raises(LoraAdapterError, match="max_loras of 1 or more"):
        engine.add_lora("a", adapters["a"])
    with pytest.raises(LoraNotLoadedError, match="adapters are off"):
        engine.add_request("r", PROMPT, GREEDY, lora="a")
    assert engine.list_loras() == []
    assert not engine.remove_lora("a")
    assert_engine_idle(engine)
