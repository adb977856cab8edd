"""Sampling on CUDA (skipped without CUDA): what CPU tests cannot show.

- float32 greedy on the GPU with repetition/presence/frequency penalties, logit bias,
  ``min_tokens`` and stop ids gives exactly the CPU's tokens; also with a token budget
  so small that prompts advance by 1-token chunks that sample nothing (the padded decode
  path then runs steps where nothing reads a result back).
- A seeded request gives the same tokens alone and batched with others, on the GPU.
- Logprobs come back on the GPU, well formed and close to the CPU's.
- An engine on ``cuda:1`` (where a host has two GPUs) runs there and leaves device 0 alone.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MODEL = "qwen2-gqa-bias-tied"
PROMPTS = random_prompts([3, 17, 40, 64, 100, 9], seed=13)
EOS_LIKE = 2  # a low id, banned by min_tokens through stop_token_ids


def _processed_params() -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=24, temperature=0.0, presence_penalty=0.8,
                       frequency_penalty=0.4),
        SamplingParams(max_tokens=24, temperature=0.0, logit_bias={5: 3.0, 17: -5.0, 99: 2.5}),
        SamplingParams(max_tokens=24, temperature=0.0, min_tokens=10,
                       stop_token_ids=[EOS_LIKE], logit_bias={EOS_LIKE: 8.0}),
        SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=0.9,
                       frequency_penalty=-0.3, logit_bias={7: 1.0}, min_tokens=4),
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
    ]


@pytest.fixture(autouse=True)
def _free_gpu_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _tokens(llm: LLM, params: list[SamplingParams]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("budget", [2048, 3], ids=["whole-prompts", "1-token-chunks"])
def test_fp32_cuda_equals_cpu_with_penalties_bias_and_min_tokens(
        budget: int, tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model(MODEL))
    options = {"dtype": "float32", "max_num_batched_tokens": budget, "max_num_seqs": 8}
    params = _processed_params()
    cpu = _tokens(LLM(folder, device="cpu", **options), params)
    gpu_llm = LLM(folder, device="cuda", gpu_memory_utilization=0.2, **options)
    gpu = _tokens(gpu_llm, params)
    assert gpu == cpu
    assert len(cpu[3]) >= 10, "min_tokens held the biased stop id back"
    runner = gpu_llm.engine.runner.decode_runner
    assert runner is not None
    assert sum(runner.runs_by_bucket.values()) > 0, "the padded decode path never ran"


def test_seeded_sampling_alone_equals_batched_on_cuda(
        tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model(MODEL))
    seeded = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.9, top_k=50, seed=4321,
                            repetition_penalty=1.1, ignore_eos=True)
    llm = LLM(folder, device="cuda", dtype="float32", gpu_memory_utilization=0.2, max_num_seqs=8)
    alone = llm.generate([PROMPTS[2]], seeded)[0].token_ids
    others = [SamplingParams(max_tokens=15, temperature=1.0, ignore_eos=True),
              SamplingParams(max_tokens=25, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=10, temperature=0.7, seed=1, min_p=0.05,
                             ignore_eos=True)]
    batched = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]],
                           [others[0], others[1], seeded, others[2]])
    assert len(alone) == 20
    assert batched[2].token_ids == alone


def test_logprobs_on_cuda(tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model(MODEL))
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=3, ignore_eos=True)
    cpu = LLM(folder, device="cpu", dtype="float32").generate(PROMPTS[:3], params)
    gpu = LLM(folder, device="cuda", dtype="float32",
              gpu_memory_utilization=0.2, max_num_seqs=8).generate(PROMPTS[:3], params)
    for c, g in zip(cpu, gpu, strict=True):
        assert g.token_ids == c.token_ids
        assert g.logprobs is not None
        assert c.logprobs is not None
        assert len(g.logprobs) == 8
        for lc, lg in zip(c.logprobs, g.logprobs, strict=True):
            assert lg.token_id == lc.token_id
            assert math.isfinite(lg.logprob)
            assert lg.logprob <= 0.0
            assert len(lg.top) == 3
            values = [v for _, v in lg.top]
            assert values == sorted(values, reverse=True)
            assert lg.top[0][0] == lg.token_id  # greedy: the sampled token is the top one
            assert abs(lg.logprob - lc.logprob) < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices (the engine runs on cuda:1)")
def test_engine_on_the_second_device(tiny_model: Callable[[str], Path]) -> None:
    folder = str(tiny_model(MODEL))
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    cpu = LLM(folder, device="cpu", dtype="float32").generate(PROMPTS, greedy)
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_allocated(0)
    llm = LLM(folder, device="cuda:1", dtype="float32", gpu_memory_utilization=0.2, max_num_seqs=8)
    runner = llm.engine.runner
    assert runner.kv_caches[0].device == torch.device("cuda:1")
    assert runner.decode_runner is not None
    assert runner.decode_runner.graphs, "no CUDA graph was captured on cuda:1"
    gpu = llm.generate(PROMPTS, greedy)
    assert [g.token_ids for g in gpu] == [c.token_ids for c in cpu]
    assert torch.cuda.memory_allocated(0) == before, "the engine allocated on device 0"
