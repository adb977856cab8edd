"""Long contexts on CPU: kvrelay against Hugging Face, and what a decode step costs per KV byte.

Three measurements, one run (ratios, not absolute times, are the result on a shared machine):

1. Throughput: ``--num-prompts`` requests (default 16) of random ordinary token ids with
   prompts uniform in ``--prompt-len`` (default 2,000-6,000 tokens), each asking for
   ``--output-len`` tokens (default 128), EOS ignored, greedy, float32: kvrelay's
   ``LLM.generate`` against transformers' continuous batching and static ``generate``
   (the systems, their options and the timing loop are ``offline.py``'s; any of its
   ``--max-num-batched-tokens``/``--hf-*`` options pass through). Output tokens/s =
   requested output tokens / wall time.
2. Decode step vs context: one decode step of ``--decode-batch`` sequences (the model's
   forward and logits through the engine's model runner, on synthetic sequences whose
   blocks are shuffled over the cache; their K/V contents do not change the work) at each
   of ``--contexts``, with the compiled CPU attention and with the reference
   (``KVRELAY_KERNELS=reference``): ms per step and ms per MB of KV read.
3. Attention alone: one layer's paged attention at the same contexts and batch, the
   reference (block gather + SDPA) against the compiled kernel.

    python benchmarks/long_context.py                 # the full run (tens of minutes)
    python benchmarks/long_context.py --quick         # 4 short requests, small tables
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import offline_systems as offline  # offline.py's systems and helpers
from harness import write_result
from harness.results import jsonable

GOAL_RATIO = 1.5


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This benchmark's options, and ``offline.py``'s (engine and HF options) for the rest."""
    doc = __doc__ or "long-context benchmark"
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default=offline.DEFAULT_MODEL)
    parser.add_argument("--num-prompts", type=int, default=None, help="default 16 (4 quick)")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=None,
                        help="prompt length range (default 2000 6000; quick 300 600)")
    parser.add_argument("--output-len", type=int, default=None, help="default 128 (quick 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", nargs="*", choices=offline.SYSTEMS,
                        default=list(offline.SYSTEMS), help="throughput systems (none: skip)")
    parser.add_argument("--contexts", type=int, nargs="*", default=None,
                        help="decode-step contexts (default 1024 2048 4096 6144; quick 256 512)")
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--decode-steps", type=int, default=None, help="default 8 (quick 3)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/long_context.json")
    args, rest = parser.parse_known_args(argv)
    if args.num_prompts is None:
        args.num_prompts = 4 if args.quick else 16
    if args.prompt_len is None:
        args.prompt_len = [300, 600] if args.quick else [2000, 6000]
    if args.output_len is None:
        args.output_len = 16 if args.quick else 128
    if args.contexts is None:
        args.contexts = [256, 512] if args.quick else [1024, 2048, 4096, 6144]
    if args.decode_steps is None:
        args.decode_steps = 3 if args.quick else 8
    engine_args = offline.parse_args(rest)
    engine_args.check_requests = None
    return args, engine_args


# --------------------------------------------------------------------------- throughput


def run_throughput(args: argparse.Namespace, engine_args: argparse.Namespace, folder: Path,
                   vocab_size: int) -> dict[str, Any]:
    span = (args.prompt_len[0], args.prompt_len[1])
    workload = offline.make_workload(args.num_prompts, args.seed, span,
                                     (args.output_len, args.output_len), vocab_size)
    warm = offline.warmup_workload(workload, vocab_size)
    print(f"throughput: {len(workload.prompts)} prompts, {workload.total_prompt_tokens} prompt "
          f"tokens, {workload.total_output_tokens} output tokens", flush=True)
    builders: dict[str, Callable[[], offline.System]] = {
        "kvrelay": lambda: offline.KvrelaySystem(args.model, workload, engine_args),
        "hf-continuous": lambda: offline.HFContinuousSystem(folder, workload, engine_args),
        "hf-static": lambda: offline.HFStaticSystem(folder, engine_args),
    }
    results = {name: offline.SystemResult(name, {}) for name in args.systems}
    # One system loaded at a time: three copies of the model and of 16 long contexts'
    # caches at once would not fit beside other users of a 24 GB machine.
    for name in args.systems:
        print(f"loading {name} ...", flush=True)
        try:
            system = builders[name]()
        except Exception as exc:  # a baseline that cannot run is reported, not fatal
            results[name].error = f"{type(exc).__name__}: {exc}"
            print(f"  {name} cannot run: {results[name].error}", flush=True)
            continue
        try:
            offline.measure([system], workload, warm, 1, results)
        finally:
            system.close()
            del system
            gc.collect()
    ordered = list(results.values())
    kv = results.get("kvrelay")
    kvrelay_tok_s = kv.output_tok_s if kv else None
    offline.print_table(ordered, kvrelay_tok_s)
    best_hf = max((r.output_tok_s for r in ordered
                   if r.system != "kvrelay" and r.output_tok_s is not None), default=None)
    summary: dict[str, Any] = {"goal_ratio": GOAL_RATIO, "best_hf_tok_s": best_hf}
    if kvrelay_tok_s and best_hf:
        ratio = kvrelay_tok_s / best_hf
        summary.update(kvrelay_vs_best_hf=ratio, goal_met=ratio >= GOAL_RATIO)
        print(f"\nkvrelay / best Hugging Face = {ratio:.2f}x (goal >= {GOAL_RATIO}x: "
              f"{'met' if ratio >= GOAL_RATIO else 'NOT met'})")
    checks = {}
    ok = [r for r in ordered if r.outputs]
    for i, a in enumerate(ok):
        for b in ok[i + 1:]:
            checks[f"{a.system} vs {b.system}"] = offline.agreement(a.outputs, b.outputs)
    for name, c in checks.items():
        print(f"  greedy agreement {name:<30} {c['identical']}/{c['requests']}  "
              f"{c['mean_common_prefix']:.3f}")
    return {"workload": workload.describe(), "results": [r.to_json() for r in ordered],
            "summary": summary, "agreement": checks}


# --------------------------------------------------------------------------- decode step


def _synthetic_decode_batch(batch: int, context: int, block_size: int, num_blocks: int,
                            rng: random.Random) -> list[Any]:
    """``batch`` sequences, each about to decode its token at position ``context - 1``, over
    distinct blocks drawn at random from the whole cache (as a long-running engine's are)."""
    from kvrelay_worker.engine.sampling_params import SamplingParams
    from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence
    from kvrelay_worker.engine.sched.sequence import Sequence as EngineSequence

    per_seq = -(-context // block_size)
    blocks = rng.sample(range(num_blocks), per_seq * batch)
    params = SamplingParams(max_tokens=1)
    scheduled = []
    for i in range(batch):
        tokens = [rng.randrange(offline.LOWEST_PROMPT_ID, 40_000) for _ in range(context)]
        seq = EngineSequence(request_id=f"decode-{i}", choice_index=0, token_ids=tokens,
                             num_prompt_tokens=context - 1, params=params)
        seq.num_computed_tokens = context - 1
        seq.block_table = array("i", blocks[i * per_seq:(i + 1) * per_seq])
        scheduled.append(ScheduledSequence(seq, 1))
    return scheduled


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _with_kernels(mode: str, call: Callable[[], object]) -> Callable[[], object]:
    """``call`` under ``KVRELAY_KERNELS=mode`` (auto: the compiled CPU kernel)."""
    def run() -> object:
        saved = os.environ.get("KVRELAY_KERNELS")
        os.environ["KVRELAY_KERNELS"] = mode
        try:
            return call()
        finally:
            if saved is None:
                del os.environ["KVRELAY_KERNELS"]
            else:
                os.environ["KVRELAY_KERNELS"] = saved
    return run


def kv_bytes_per_token(config: Any) -> int:
    """Float32 K and V of every layer for one token: what a decode step reads per token."""
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4


def run_decode_steps(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-step decode time and attention time at each context, kernel vs reference."""
    from transformers import AutoConfig

    from kvrelay_worker import LLM
    from kvrelay_worker.loading import prepare_model

    longest = max(args.contexts)
    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(prepare_model(args.model)))
    cache_gib = 1.05 * args.decode_batch * longest * per_token / (1 << 30) + 0.25
    llm = LLM(args.model, device="cpu", dtype="float32", quantization="none",
              max_num_seqs=args.decode_batch,
              max_model_len=longest + 16, kv_cache_memory=int(cache_gib * (1 << 30)),
              enable_prefix_caching=False)
    runner = llm.engine.runner
    model = llm.engine.model
    cfg = model.config
    block_size = llm.engine.config.block_size
    kv_per_token = per_token
    layer = model.attention_layers()[0]
    rng = random.Random(args.seed)
    rows = []
    for context in args.contexts:
        scheduled = _synthetic_decode_batch(args.decode_batch, context, block_size,
                                            runner.num_blocks, rng)
        step, attn = _measure_context(runner, layer, scheduled, args.decode_steps)
        kv_mb = args.decode_batch * context * kv_per_token / 1e6
        rows.append({
            "context": context, "batch": args.decode_batch, "kv_mb_per_step": kv_mb,
            "step_ms_kernel": step["auto"], "step_ms_reference": step["reference"],
            "step_ms_per_kv_mb_kernel": step["auto"] / kv_mb,
            "step_ms_per_kv_mb_reference": step["reference"] / kv_mb,
            "attention_layer_ms_kernel": attn["auto"],
            "attention_layer_ms_reference": attn["reference"],
            "attention_layer_kv_mb": kv_mb / cfg.num_hidden_layers,
        })
        print(f"  context {context}: step {step['auto']:.1f} ms (reference "
              f"{step['reference']:.1f}), one layer's attention {attn['auto']:.2f} ms "
              f"(reference {attn['reference']:.2f})", flush=True)
    return rows


def _measure_context(runner: Any, layer: Any, scheduled: list[Any],
                     repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms of a whole decode step and of one layer's attention, per kernel mode."""
    import torch

    from kvrelay_kernels import paged_attention

    meta = runner.to_device(runner.prepare_host(scheduled)).meta
    query = torch.randn(len(scheduled), layer.num_heads, layer.head_dim)
    key_cache, value_cache = layer.kv_cache[0], layer.kv_cache[1]

    def step() -> object:
        return runner.execute(scheduled)

    def attend() -> object:
        return paged_attention(query, key_cache, value_cache, meta.block_tables,
                               meta.query_start_loc, meta.seq_lens, layer.scale)

    modes = ("auto", "reference")
    step_ms = {mode: _median_ms(_with_kernels(mode, step), repeats) for mode in modes}
    attn_ms = {mode: _median_ms(_with_kernels(mode, attend), 4 * repeats) for mode in modes}
    return step_ms, attn_ms


def print_decode_table(rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    batch = rows[0]["batch"]
    print(f"\ndecode step, batch {batch} (model forward + logits), and one layer's attention:")
    print(f"{'context':>8}{'KV MB':>9}{'step ms':>10}{'ms/MB':>8}{'ref step ms':>13}"
          f"{'ref ms/MB':>11}{'attn ms':>9}{'ref attn ms':>13}{'speed-up':>10}")
    for r in rows:
        print(f"{r['context']:>8}{r['kv_mb_per_step']:>9.0f}{r['step_ms_kernel']:>10.1f}"
              f"{r['step_ms_per_kv_mb_kernel']:>8.3f}{r['step_ms_reference']:>13.1f}"
              f"{r['step_ms_per_kv_mb_reference']:>11.3f}{r['attention_layer_ms_kernel']:>9.2f}"
              f"{r['attention_layer_ms_reference']:>13.2f}"
              f"{r['attention_layer_ms_reference'] / r['attention_layer_ms_kernel']:>9.2f}x")


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    args, engine_args = parse_args(argv)
    import torch
    from transformers import AutoConfig

    from kvrelay_worker.loading import prepare_model

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = prepare_model(args.model, progress=False)
    hf_config = AutoConfig.from_pretrained(folder)
    vocab_size = int(hf_config.vocab_size)
    if engine_args.kv_cache_gib == 2.0:  # offline.py's default: too small for 16 x 6k
        longest = args.prompt_len[1] + args.output_len
        engine_args.kv_cache_gib = (1.1 * args.num_prompts * longest
                                    * kv_bytes_per_token(hf_config) / (1 << 30))
    print(f"model {args.model}, CPU float32, {torch.get_num_threads()} threads", flush=True)
    report: dict[str, Any] = {"model": args.model,
                              "engine_options": {k: jsonable(v)
                                                 for k, v in vars(engine_args).items()}}
    if args.contexts:
        print("decode step vs context ...", flush=True)
        report["decode_steps"] = run_decode_steps(args)
    if args.systems:
        report["throughput"] = run_throughput(args, engine_args, folder, vocab_size)
    print_decode_table(report.get("decode_steps", []))
    report["machine_after"] = {"load_average": list(os.getloadavg())}
    write_result(args.out, "long_context", args, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
