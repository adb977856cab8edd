"""Adapters over a quantized base model (int8, int4: the LoRA linear wraps the quantized one).

The adapter's update is added in float to the quantized product, so there is no merged
reference to equal; what must hold: requests without an adapter get exactly the tokens
of the same quantized engine with LoRA off, requests with one get other tokens, the
same ones in a batch as alone, and every block is free afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts
from helpers.lora_adapters import make_peft_adapter

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import EngineConfig, LLMEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = random_prompts([5, 12, 30], seed=9)

pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(engine: LLMEngine, requests: dict[str, tuple[list[int], str | None]]
            ) -> dict[str, list[int]]:
    for request_id, (prompt, lora) in requests.items():
        engine.add_request(request_id, prompt, GREEDY, lora=lora)
    finals = final_outputs(run_engine(engine))
    assert_engine_idle(engine)
    return {rid: out.choices[0].token_ids for rid, out in finals.items()}


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_adapter_over_a_quantized_base(tiny_model: Callable[[str], Path], tmp_path: Path,
                                       quantization: str) -> None:
    folder = tiny_model("llama-mqa")
    adapter = make_peft_adapter(folder, tmp_path / "adapter", seed=5)

    def engine(max_loras: int) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32",
                                      quantization=quantization, max_loras=max_loras,
                                      num_kv_blocks=64))

    plain = _tokens(engine(0), {f"b{i}": (p, None) for i, p in enumerate(PROMPTS)})
    lora = engine(1)
    lora.add_lora("a", adapter)
    mixed = _tokens(lora, {**{f"b{i}": (p, None) for i, p in enumerate(PROMPTS)},
                           **{f"a{i}": (p, "a") for i, p in enumerate(PROMPTS)}})
    alone = {f"a{i}": _tokens(lora, {f"a{i}": (p, "a")})[f"a{i}"]
             for i, p in enumerate(PROMPTS)}
    assert {k: v for k, v in mixed.items() if k.startswith("b")} == plain
    assert {k: v for k, v in mixed.items() if k.startswith("a")} == alone
    assert all(alone[f"a{i}"] != plain[f"b{i}"] for i in range(len(PROMPTS)))
