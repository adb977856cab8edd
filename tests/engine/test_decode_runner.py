"""The padded fixed-shape decode path (what CUDA graphs replay) computes what the plain path does.

The graphs themselves need CUDA (tests/engine/test_gpu_engine.py); the packing, padding
and buffer handling around them are device-independent and checked here on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.runner.cuda_graphs import DecodeRunner, batch_buckets


def test_batch_buckets() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_padded_decode_matches_plain_decode(tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model("qwen2-gqa-bias-tied"))
    prompts = random_prompts([3, 17, 40, 5, 64], seed=3)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = LLM(folder, device="cpu", dtype="float32").generate(prompts, params)

    padded_llm = LLM(folder, device="cpu", dtype="float32", max_num_seqs=8)
    engine = padded_llm.engine
    runner = DecodeRunner(engine.model, max_batch=6, max_model_len=engine.max_model_len,
                          block_size=engine.config.block_size, device=engine.device)
    engine.runner.decode_runner = runner
    padded = padded_llm.generate(prompts, params)
    assert [o.token_ids for o in padded] == [o.token_ids for o in plain]
    # Decode steps of 5 sequences ran padded to the bucket of 6, and wrote no padding row.
    assert runner.runs_by_bucket.get(6, 0) >= 10
    stats = engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]


def test_decode_step_with_a_prefill_chunk_that_does_not_sample(
        tiny_model: Callable[[str], Path]) -> None:
    """A prompt still prefilling can get a 1-token chunk (the last token of budget).

    The step is then all 1-token rows, so the padded path takes it, but that row samples
    nothing: the step has one logits row fewer than it has rows, and the sampler must get
    exactly the sampling rows (else the batch's per-row tensors do not match the logits).
    """
    folder = str(tiny_model("qwen2-gqa-bias-tied"))
    prompts = random_prompts([1, 1, 1, 10], seed=11)
    params = [SamplingParams(max_tokens=12, temperature=0.9, seed=1000 + i, ignore_eos=True)
              for i in range(len(prompts))]
    options = {"device": "cpu", "dtype": "float32", "max_num_seqs": 4,
               "max_num_batched_tokens": 4}
    plain = LLM(folder, **options).generate(prompts, params)

    padded_llm = LLM(folder, **options)
    engine = padded_llm.engine
    runner = DecodeRunner(engine.model, max_batch=4, max_model_len=engine.max_model_len,
                          block_size=engine.config.block_size, device=engine.device)
    engine.runner.decode_runner = runner
    padded = padded_llm.generate(prompts, params)
    assert [o.token_ids for o in padded] == [o.token_ids for o in plain]
    assert all(len(o.choices[0].token_ids) == 12 for o in padded)
    # Steps 1-9: three 1-token prompts, then their decodes, beside a 1-token chunk of the
    # 10-token prompt (3 sampling rows of 4); step 10 its last chunk, steps 11-12 four
    # decodes; then it decoded alone. All of them ran on the padded path.
    assert runner.runs_by_bucket == {4: 12, 1: 9}
    stats = engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]
