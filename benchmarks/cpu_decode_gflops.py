"""Decode GFLOP/s against prefill GFLOP/s on CPU (SmolLM2, float32), one run.

Decode at batch B multiplies a ``[B, hidden]`` activation by every weight matrix once per
step, so it streams every weight from memory once per B tokens; prefill streams them once
per chunk of hundreds of tokens. This benchmark measures both through the real
``LLMEngine`` on the same model in the same process and prints their ratio.

FLOPs are counted from the model's shape, for exactly the work each phase asks for:

- per token: ``2 x (parameters in the decoder's matmuls)`` (q/k/v, o, gate/up, down per
  layer; for MoE layers the router and ``top_k`` experts);
- per sampled row: ``2 x vocab x hidden`` (the LM head runs only on rows that sample);
- attention: ``4 x heads x head_dim x context`` per token per layer (``Q K^T`` and
  ``P V``), ``context`` being the number of positions the token attends to.

Prefill: ``--batch`` requests with ``max_tokens=1`` (each prompt prefills, samples once and
finishes), every engine step timed. Decode: ``--batch`` other requests prefill untimed,
then ``--steps`` steps in which every sequence decodes one token are timed. GFLOP/s =
counted FLOPs / wall time of the engine steps (scheduling, sampling and detokenisation
included: what a server sees); the model's share (``ModelRunner.execute``) is also given.
``--profile`` adds a ``torch.profiler`` table of three decode steps, ``--gemm`` each
matmul's GFLOP/s alone at decode's and prefill's row counts.

    python benchmarks/cpu_decode_gflops.py                  # batch 48, ~220-token prompts
    python benchmarks/cpu_decode_gflops.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import write_result
from harness.model_work import decode_step_flops, prefill_flops

GOAL = 0.8  # issue 18: decode GFLOP/s at least 80% of prefill's at batch 48
LOWEST_PROMPT_ID = 100  # ordinary SmolLM2 token ids, as benchmarks/offline.py draws them
RESULTS = Path(__file__).parent / "results"


# --------------------------------------------------------------------------- runs


def _prompts(rng: random.Random, batch: int, lens: tuple[int, int], vocab: int
             ) -> list[list[int]]:
    return [[rng.randrange(LOWEST_PROMPT_ID, vocab) for _ in range(rng.randint(*lens))]
            for _ in range(batch)]


class _ExecuteTimer:
    """Wraps ``ModelRunner.execute`` to add up the time the model's part of a step takes."""

    def __init__(self, execute: Callable[..., Any]) -> None:
        self.execute = execute
        self.seconds = 0.0

    def __call__(self, scheduled: Any) -> Any:
        start = time.perf_counter()
        out = self.execute(scheduled)
        self.seconds += time.perf_counter() - start
        return out


def build_engine(model: str, batch: int, budget: int, max_len: int) -> Any:
    from kvrelay_worker.engine import EngineConfig, LLMEngine

    config = EngineConfig(model=model, device="cpu", dtype="float32", max_num_seqs=batch,
                          max_num_batched_tokens=budget, enable_prefix_caching=False,
                          max_model_len=max_len, kv_cache_memory=1 << 30)
    return LLMEngine(config, progress=False)


def run_prefill(engine: Any, prompts: list[list[int]]) -> dict[str, Any]:
    from kvrelay_worker.engine import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"prefill-{i}", prompt, params)
    timer = _ExecuteTimer(engine.runner.execute)
    engine.runner.execute = timer
    steps = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    wall = time.perf_counter() - start
    del engine.runner.execute
    flops = prefill_flops(engine.model.config, [len(p) for p in prompts])
    return {"tokens": sum(len(p) for p in prompts), "steps": steps, "wall_s": wall,
            "model_s": timer.seconds, "gflop": flops / 1e9,
            "gflops": flops / wall / 1e9, "gflops_model": flops / timer.seconds / 1e9}


def _all_decoding(engine: Any, batch: int) -> bool:
    running = engine.scheduler.running
    return len(running) == batch and all(
        s.num_computed_tokens >= s.num_prompt_tokens for s in running)


def run_decode(engine: Any, prompts: list[list[int]], steps: int,
               profile_steps: int) -> dict[str, Any]:
    from kvrelay_worker.engine import SamplingParams

    batch = len(prompts)
    params = SamplingParams(max_tokens=steps + profile_steps + 8, temperature=0.0,
                            ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"decode-{i}", prompt, params)
    while not _all_decoding(engine, batch):
        engine.step()
    engine.step()  # one warm-up decode step
    timer = _ExecuteTimer(engine.runner.execute)
    engine.runner.execute = timer
    config = engine.model.config
    flops = 0
    times = []
    for _ in range(steps):
        # The step's new token sits at position num_computed_tokens: it sees that many + 1.
        flops += decode_step_flops(config, [s.num_computed_tokens + 1
                                            for s in engine.scheduler.running])
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    del engine.runner.execute
    wall = sum(times)
    contexts = [s.num_computed_tokens for s in engine.scheduler.running]
    profile = profile_decode(engine, profile_steps) if profile_steps else None
    for i in range(batch):
        engine.abort_request(f"decode-{i}")
    engine.step()
    return {"batch": batch, "steps": steps, "wall_s": wall, "model_s": timer.seconds,
            "step_ms_median": statistics.median(times) * 1e3,
            "mean_context_end": statistics.mean(contexts), "gflop": flops / 1e9,
            "gflops": flops / wall / 1e9, "gflops_model": flops / timer.seconds / 1e9,
            "profile": profile}


def profile_decode(engine: Any, steps: int) -> str:
    """``torch.profiler``'s operator table over ``steps`` decode steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    table: str = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
    return table


# --------------------------------------------------------------------------- GEMMs alone


def gemm_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """``name -> (out, in)`` of each dense matmul one token goes through."""
    hidden = config.hidden_size
    return {"qkv_proj": (config.q_size + 2 * config.kv_size, hidden),
            "o_proj": (hidden, config.q_size),
            "gate_up_proj": (2 * config.intermediate_size, hidden),
            "down_proj": (hidden, config.intermediate_size),
            "lm_head": (config.vocab_size, hidden)}


def gemm_table(config: Any, rows: Sequence[int], reps: int = 10) -> list[dict[str, Any]]:
    """GFLOP/s of ``F.linear`` at each shape for ``rows`` tokens (the 20th-percentile time
    of ``reps``: the machine is shared), with the arithmetic intensity in float32."""
    import torch
    import torch.nn.functional as F

    out = []
    for name, (n, k) in gemm_shapes(config).items():
        weight = torch.randn(n, k) * 0.02
        for m in rows:
            x = torch.randn(m, k)
            F.linear(x, weight)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                F.linear(x, weight)
                times.append(time.perf_counter() - start)
            best = sorted(times)[len(times) // 5]
            flops = 2 * m * n * k
            out.append({"matmul": name, "rows": m, "ms": best * 1e3,
                        "gflops": flops / best / 1e9,
                        "flop_per_byte": flops / (4 * (n * k + m * k + m * n))})
    return out


def format_gemm_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'matmul':<13} {'rows':>5} {'ms':>8} {'GFLOP/s':>8} {'flop/byte':>9}"]
    lines += [f"{r['matmul']:<13} {r['rows']:>5} {r['ms']:>8.3f} {r['gflops']:>8.1f} "
              f"{r['flop_per_byte']:>9.1f}" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- report


def environment() -> dict[str, Any]:
    import torch

    from kvrelay_worker.cpu_threads import cpu_thread_settings

    return {"torch": torch.__version__, "cpu_count": os.cpu_count(),
            "threads": cpu_thread_settings(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def format_table(prefill: dict[str, Any], decode: dict[str, Any]) -> str:
    lines = [f"{'phase':<8} {'tokens':>7} {'steps':>6} {'GFLOP':>8} {'wall s':>7} "
             f"{'GFLOP/s':>8} {'model GFLOP/s':>14}"]
    for name, r, tokens in (("prefill", prefill, prefill["tokens"]),
                            ("decode", decode, decode["batch"] * decode["steps"])):
        lines.append(f"{name:<8} {tokens:>7} {r['steps']:>6} {r['gflop']:>8.1f} "
                     f"{r['wall_s']:>7.2f} {r['gflops']:>8.1f} {r['gflops_model']:>14.1f}")
    ratio = decode["gflops"] / prefill["gflops"]
    model_ratio = decode["gflops_model"] / prefill["gflops_model"]
    lines.append(f"decode / prefill: {ratio:.2f} (engine steps), {model_ratio:.2f} (model); "
                 f"goal >= {GOAL:.2f}; decode step median {decode['step_ms_median']:.1f} ms "
                 f"at batch {decode['batch']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(208, 232))
    parser.add_argument("--steps", type=int, default=24, help="timed decode steps")
    parser.add_argument("--budget", type=int, default=512,
                        help="max_num_batched_tokens (prefill chunk per step)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as is)")
    parser.add_argument("--profile", action="store_true",
                        help="print a torch.profiler table of 3 decode steps")
    parser.add_argument("--gemm", action="store_true",
                        help="also time each matmul alone at --batch and --budget rows")
    parser.add_argument("--quick", action="store_true", help="batch 8, 4 steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", "--output", dest="output", type=Path, default=RESULTS / "cpu-decode-gflops.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.steps = 8, 4
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoConfig

    from kvrelay_worker.engine import SamplingParams
    from kvrelay_worker.loading import prepare_model

    if args.threads:
        torch.set_num_threads(args.threads)
    vocab = int(AutoConfig.from_pretrained(prepare_model(args.model, progress=False)).vocab_size)
    rng = random.Random(args.seed)
    max_len = args.prompt_len[1] + args.steps + 16
    engine = build_engine(args.model, args.batch, args.budget, max_len)
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("warm", _prompts(rng, 1, (32, 32), vocab)[0], warm)
    while engine.has_unfinished_requests():
        engine.step()
    prefill = run_prefill(engine, _prompts(rng, args.batch, args.prompt_len, vocab))
    decode = run_decode(engine, _prompts(rng, args.batch, args.prompt_len, vocab),
                        args.steps, 3 if args.profile else 0)
    env = environment()
    print(f"{args.model}, CPU float32, batch {args.batch}, prompts {args.prompt_len[0]}.."
          f"{args.prompt_len[1]} tokens, budget {args.budget}; threads {env['threads']}")
    print(format_table(prefill, decode))
    if decode["profile"]:
        print(decode["profile"])
    gemms = gemm_table(engine.model.config, (args.batch, args.budget)) if args.gemm else []
    if gemms:
        print(format_gemm_table(gemms))
    result = {"environment": env, "prefill": prefill, "decode": decode, "gemms": gemms,
              "decode_over_prefill": decode["gflops"] / prefill["gflops"],
              "decode_over_prefill_model": decode["gflops_model"] / prefill["gflops_model"],
              "flops_formula": "2*matmul_params*tokens + 2*vocab*hidden*sampled_rows "
                               "+ 4*heads*head_dim*context*layers per token"}
    write_result(args.output, "cpu_decode_gflops", args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
