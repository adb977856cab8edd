"""The native CPU decode step (``cpu_kernels/decode_step.cpp``) computes what the per-op
path computes: the same bits with quantized weights, float rounding apart with float32.

Each test runs the same requests twice, with the step (the default) and without it
(``KVRELAY_CPU_DECODE_STEP=0``), and counts the steps it took, so a test cannot pass by
never using it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.runner.cpu_decode import CpuDecodeRunner


def _llm(model: str, step: bool, monkeypatch: pytest.MonkeyPatch, **options: Any) -> LLM:
    monkeypatch.setenv("KVRELAY_CPU_DECODE_STEP", "1" if step else "0")
    llm = LLM(model, device="cpu", dtype="float32", **options)
    runner = llm.engine.runner.decode_runner
    assert isinstance(runner, CpuDecodeRunner) == step
    return llm


def _count_steps(llm: LLM) -> list[int]:
    """A counter of the steps the native runner takes (one cell, so callers read it)."""
    runner = llm.engine.runner.decode_runner
    assert isinstance(runner, CpuDecodeRunner)
    taken = [0]
    run = runner.run

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        taken[0] += 1
        return run(*args, **kwargs)

    runner.run = counted  # type: ignore[method-assign]
    return taken


def _outputs(llm: LLM, prompts: list[list[int]], params: Any,
             one_by_one: bool = False) -> list[Any]:
    """Tokens and sampled logprobs of every choice (``one_by_one``: a request at a time)."""
    batches = [[p] for p in prompts] if one_by_one else [prompts]
    return [(c.token_ids, None if c.logprobs is None else [lp.logprob for lp in c.logprobs])
            for batch in batches for o in llm.generate(batch, params) for c in o.choices]


def _smollm2_both_ways(monkeypatch: pytest.MonkeyPatch, quantization: str, seed: int
                       ) -> tuple[list[Any], list[Any], int]:
    """SmolLM2's outputs on three prompts, one request at a time and then all three at once,
    op by op and with the step, and the steps the native runner took."""
    prompts = random_prompts([5, 40, 120], seed=seed)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
    options = {"quantization": quantization, "enable_prefix_caching": False}
    outputs = []
    with one_torch_thread():
        for step in (False, True):
            llm = _llm("smollm2-135m-instruct", step, monkeypatch, **options)
            taken = _count_steps(llm) if step else [0]
            outputs.append(_outputs(llm, prompts, params, one_by_one=True)
                           + _outputs(llm, prompts, params))
            del llm
    return outputs[0], outputs[1], taken[0]


@pytest.mark.slow
def test_kept_q4_1_smollm2_steps_give_the_per_op_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    per_op, stepped, taken = _smollm2_both_ways(monkeypatch, "gguf", seed=44)
    assert stepped == per_op  # tokens and every sampled logprob, bit for bit
    assert taken == 3 * 23 + 23  # every step after the prefills: 1 row, then 3 rows


@pytest.mark.slow
def test_float32_smollm2_steps_match_the_per_op_path(monkeypatch: pytest.MonkeyPatch) -> None:
    per_op, stepped, taken = _smollm2_both_ways(monkeypatch, "none", seed=45)
    assert [tokens for tokens, _ in stepped] == [tokens for tokens, _ in per_op]
    for (_, a), (_, b) in zip(stepped, per_op, strict=True):
        assert a is not None
        assert b is not None
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
    assert taken == 3 * 23 + 23


def _feature_requests() -> list[tuple[list[list[int]], SamplingParams]]:
    """Requests that exercise the engine around the step: greedy and seeded sampling,
    n > 1, beam search, a JSON schema, prompts sharing a prefix (prefix-cache hits)."""
    shared = random_prompts([48], seed=7)[0]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    return [
        (random_prompts([3, 17, 40, 5, 64, 9], seed=3),
         SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)),
        ([[*shared, 101, 102], [*shared, 103], [*shared, 104, 105, 106]],
         SamplingParams(max_tokens=12, temperature=0.8, seed=5, n=2, ignore_eos=True)),
        (random_prompts([11, 30], seed=9),
         SamplingParams(max_tokens=10, beam_width=3, ignore_eos=True)),
        (random_prompts([6], seed=13),
         SamplingParams(max_tokens=24, temperature=0.0,
                        response_format={"type": "json_schema",  # type: ignore[arg-type]
                                         "json_schema": {"name": "t", "schema": schema}})),
    ]


@pytest.mark.parametrize("options", [
    # small budget: prompts are prefilled in chunks beside decoding rows
    {"max_num_batched_tokens": 32, "enable_prefix_caching": True},
    # few blocks: sequences are preempted and recomputed
    {"num_kv_blocks": 24, "block_size": 8, "enable_prefix_caching": False},
    # n-gram speculation: steps that verify drafts run op by op, the others natively
    {"speculative": "ngram", "enable_prefix_caching": True},
], ids=["chunked-prefix", "preemption", "speculation"])
def test_engine_features_through_the_step(tiny_model: Callable[[str], Path],
                                          monkeypatch: pytest.MonkeyPatch,
                                          options: dict[str, Any]) -> None:
    folder = str(tiny_model("qwen2-gqa-bias-tied"))  # q/k/v biases, tied embeddings
    options = {"quantization": "int8", "max_num_seqs": 8, **options}
    with one_torch_thread():
        per_op_llm = _llm(folder, False, monkeypatch, **options)
        per_op = [_outputs(per_op_llm, p, s) for p, s in _feature_requests()]
        llm = _llm(folder, True, monkeypatch, **options)
        taken = _count_steps(llm)
        stepped = [_outputs(llm, p, s) for p, s in _feature_requests()]
        stats = llm.engine.stats()
    assert stepped == per_op
    assert taken[0] >= 20
    assert stats["free_blocks"] == stats["total_blocks"]
    if "num_kv_blocks" in options:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("model", ["mistral-window", "llama-mqa", "phi3-fused"])
def test_layer_shapes_through_the_step(tiny_model: Callable[[str], Path],
                                       monkeypatch: pytest.MonkeyPatch, model: str) -> None:
    """A sliding window, one KV head, Phi-3's fused checkpoint; float32 and int8."""
    folder = str(tiny_model(model))
    prompts = random_prompts([3, 40, 90], seed=21)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=1)
    with one_torch_thread():
        for quantization in ("int8", "none"):
            per_op = _outputs(_llm(folder, False, monkeypatch, quantization=quantization),
                              prompts, params)
            llm = _llm(folder, True, monkeypatch, quantization=quantization)
            taken = _count_steps(llm)
            stepped = _outputs(llm, prompts, params)
            assert taken[0] >= 39
            if quantization == "int8":
                assert stepped == per_op
                continue
            assert [t for t, _ in stepped] == [t for t, _ in per_op]
            for (_, a), (_, b) in zip(stepped, per_op, strict=True):
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)


def test_rows_spread_over_several_threads(tiny_model: Callable[[str], Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads, four rows: each thread runs the SiLU of its own rows (ATen's, whose
    output views are inference tensors that only a thread in inference mode may write;
    without that the step's exception terminated the process)."""
    folder = str(tiny_model("llama-mqa"))
    prompts = random_prompts([3, 17, 40, 5], seed=31)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        per_op = _outputs(_llm(folder, False, monkeypatch, quantization="int8"), prompts, params)
        llm = _llm(folder, True, monkeypatch, quantization="int8")
        taken = _count_steps(llm)
        stepped = _outputs(llm, prompts, params)
    finally:
        torch.set_num_threads(before)
    assert stepped == per_op
    assert taken[0] >= 15


@pytest.mark.parametrize("model", ["gemma2-softcap-window", "qwen3-qk-norm", "mixtral-moe"])
def test_layers_it_does_not_know_run_op_by_op(tiny_model: Callable[[str], Path],
                                              monkeypatch: pytest.MonkeyPatch,
                                              model: str) -> None:
    monkeypatch.delenv("KVRELAY_CPU_DECODE_STEP", raising=False)
    llm = LLM(str(tiny_model(model)), device="cpu", dtype="float32")
    assert llm.engine.runner.decode_runner is None
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].choices[0].token_ids) == 3


def test_bad_step_arguments_are_refused(tiny_model: Callable[[str], Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The step checks its arguments before its parallel region (where an error could not
    be raised): torch's own error, and the cache is left as it was."""
    llm = _llm(str(tiny_model("llama-mqa")), True, monkeypatch)
    runner = llm.engine.runner.decode_runner
    assert isinstance(runner, CpuDecodeRunner)
    caches = [layer.kv_cache for layer in runner.attention]
    before = [c.clone() for c in caches]
    cfg = llm.engine.model.config
    hidden = torch.randn(1, cfg.hidden_size)
    tables = torch.zeros(1, 4, dtype=torch.int32)
    good = (torch.tensor([3]), torch.tensor([3]), torch.tensor([4], dtype=torch.int32))
    runner.step.run(hidden, good[0], caches, good[1], tables, good[2])  # accepted
    capacity = caches[0].shape[1] * caches[0].shape[2]
    cases = {
        "outside the cache": (torch.tensor([3]), torch.tensor([capacity]), good[2]),
        "seq_len": (torch.tensor([3]), torch.tensor([3]), torch.tensor([9], dtype=torch.int32)),
        "rotary table": (torch.tensor([10**7]), torch.tensor([3]),
                         torch.tensor([10**7 + 1], dtype=torch.int32)),
    }
    for match, (positions, slots, lens) in cases.items():
        with pytest.raises(RuntimeError, match=match):
            runner.step.run(hidden, positions, caches, slots, tables, lens)
    with pytest.raises(RuntimeError, match="hidden must be"):
        runner.step.run(hidden.double(), *good[:1], caches, good[1], tables, good[2])
    with pytest.raises(RuntimeError, match="one KV cache per layer"):
        runner.step.run(hidden, good[0], caches[:-1], good[1], tables, good[2])
    # only the accepted call wrote: K and V of slot 3 (block 0) in every layer
    for cache, old in zip(caches, before, strict=True):
        assert (cache != old).any(dim=(3, 4)).nonzero().tolist() == [[0, 0, 3], [1, 0, 3]]
