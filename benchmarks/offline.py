"""Offline throughput on CPU: kvrelay against Hugging Face continuous batching and static generate.

One workload, three systems, one run (absolute times drift on shared machines; the ratios
are the result). The workload is ``--num-prompts`` prompts of random ordinary token ids
(lengths uniform in 32..256) that each ask for their own number of output tokens (uniform
in 32..128) with EOS ignored, greedy, float32:

- ``kvrelay``: one ``LLM.generate`` call, one ``SamplingParams(max_tokens=n_i,
  temperature=0, ignore_eos=True)`` per request.
- ``hf-continuous``: transformers' own continuous batching manager
  (``model.init_continuous_batching``), every request added with its own
  ``max_new_tokens``, EOS disabled (``eos_token_id=-1``).
- ``hf-static``: one left-padded ``generate`` over all prompts with
  ``max_new_tokens = max(n_i)``; only the tokens each request asked for count.

Output tokens/s = requested output tokens / wall time of the generation (model loading and a
short warm-up are not timed). Prints a table with each system's ratio to kvrelay, checks that
greedy tokens agree across systems, writes JSON and a PNG bar chart next to it.

    python benchmarks/offline.py                      # the full run (several minutes)
    python benchmarks/offline.py --quick              # 8 short requests (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import offline_systems, write_result
from harness.offline_systems import (
    GOAL_RATIO,
    HFContinuousSystem,
    HFStaticSystem,
    KvrelaySystem,
    System,
    SystemResult,
    agreement,
    make_workload,
    measure,
    print_table,
    warmup_workload,
)


def write_plot(path: Path, results: list[SystemResult], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.output_tok_s is not None]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    colors = {"kvrelay": "#2b6cb0", "hf-continuous": "#dd6b20", "hf-static": "#718096"}
    bars = ax.bar([r.system for r in shown], [r.output_tok_s or 0.0 for r in shown],
                  color=[colors.get(r.system, "#999999") for r in shown])
    for bar, r in zip(bars, shown, strict=True):
        ax.annotate(f"{r.output_tok_s:.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("output tokens/s (higher is better)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/offline.json")
    return offline_systems.parse_args(argv, parser)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoConfig

    from kvrelay_worker.loading import prepare_model

    if args.threads:
        torch.set_num_threads(args.threads)
    folder = prepare_model(args.model, progress=False)
    vocab_size = int(AutoConfig.from_pretrained(folder).vocab_size)
    workload = make_workload(args.num_prompts, args.seed, args.prompt_len, args.output_len,
                             vocab_size)
    warm = warmup_workload(workload, vocab_size)
    print(f"model {args.model} ({folder}), CPU float32, {torch.get_num_threads()} threads; "
          f"{len(workload.prompts)} prompts, {workload.total_prompt_tokens} prompt tokens, "
          f"{workload.total_output_tokens} requested output tokens", flush=True)

    builders: dict[str, Callable[[], System]] = {
        "kvrelay": lambda: KvrelaySystem(args.model, workload, args),
        "hf-continuous": lambda: HFContinuousSystem(folder, workload, args),
        "hf-static": lambda: HFStaticSystem(folder, args),
    }
    results = {name: SystemResult(name, {}) for name in args.systems}
    systems: list[System] = []
    try:
        for name in args.systems:
            print(f"loading {name} ...", flush=True)
            try:
                systems.append(builders[name]())
            except Exception as exc:  # a baseline that cannot run is reported, not fatal
                results[name].error = f"{type(exc).__name__}: {exc}"
                print(f"  {name} cannot run: {results[name].error}", flush=True)
        measure(systems, workload, warm, args.repeats, results)
    finally:
        for system in systems:
            system.close()
    systems.clear()
    gc.collect()

    kv_result = results.get("kvrelay")
    kvrelay_tok_s = kv_result.output_tok_s if kv_result else None
    ordered = list(results.values())
    print_table(ordered, kvrelay_tok_s)
    hf_best = max((r.output_tok_s for r in ordered
                   if r.system != "kvrelay" and r.output_tok_s is not None), default=None)
    summary: dict[str, Any] = {"goal_ratio": GOAL_RATIO, "best_hf_tok_s": hf_best}
    if kvrelay_tok_s and hf_best:
        summary["kvrelay_vs_best_hf"] = kvrelay_tok_s / hf_best
        summary["goal_met"] = kvrelay_tok_s / hf_best >= GOAL_RATIO
        print(f"\nkvrelay / best Hugging Face = {kvrelay_tok_s / hf_best:.2f}x "
              f"(goal >= {GOAL_RATIO}x: {'met' if summary['goal_met'] else 'NOT met'})")

    checks: dict[str, Any] = {}
    limit = args.check_requests
    ok = [r for r in ordered if r.outputs]
    for i, a in enumerate(ok):
        for b in ok[i + 1:]:
            checks[f"{a.system} vs {b.system}"] = agreement(a.outputs[:limit], b.outputs[:limit])
    if checks:
        print("\ngreedy agreement (identical requests, mean common-prefix share):")
        for name, c in checks.items():
            print(f"  {name:<30} {c['identical']}/{c['requests']}  {c['mean_common_prefix']:.3f}")
    for r in ordered:
        if r.produced_tokens_ok is False:
            print(f"  WARNING: {r.system} did not produce exactly the requested token counts")

    out = Path(args.out)
    write_result(out, "offline", args, {
        "model": args.model,
        "model_folder": str(folder),
        "workload": workload.describe(),
        "results": [r.to_json() for r in ordered],
        "summary": summary,
        "agreement": checks,
    })
    png = out.with_suffix(".png")
    title = (f"{args.model}, CPU fp32, {len(workload.prompts)} prompts, "
             f"{workload.total_output_tokens} output tokens")
    write_plot(png, ordered, title)
    print(f"\nwrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
