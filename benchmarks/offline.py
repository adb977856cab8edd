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
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYSTEMS = ("kvrelay", "hf-continuous", "hf-static")
DEFAULT_MODEL = "smollm2-135m-instruct"
GOAL_RATIO = 1.5
# Token ids below this are special or byte-level in SmolLM2's vocabulary: prompts avoid them
# (the project's HF-parity tests draw "ordinary" ids the same way).
LOWEST_PROMPT_ID = 100


# --------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """Prompts and per-request output lengths, identical for every system."""

    prompts: list[list[int]]
    output_lens: list[int]
    seed: int
    prompt_len_range: tuple[int, int]
    output_len_range: tuple[int, int]

    @property
    def total_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def total_output_tokens(self) -> int:
        return sum(self.output_lens)

    def describe(self) -> dict[str, Any]:
        return {
            "num_prompts": len(self.prompts),
            "seed": self.seed,
            "prompt_len_range": list(self.prompt_len_range),
            "output_len_range": list(self.output_len_range),
            "total_prompt_tokens": self.total_prompt_tokens,
            "total_output_tokens": self.total_output_tokens,
            "max_prompt_len": max(len(p) for p in self.prompts),
            "max_output_len": max(self.output_lens),
            "prompt_lens": [len(p) for p in self.prompts],
            "output_lens": list(self.output_lens),
        }


def make_workload(num_prompts: int, seed: int, prompt_len: tuple[int, int],
                  output_len: tuple[int, int], vocab_size: int) -> Workload:
    """Seeded random prompts, so every system (and every run) sees the same requests."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(num_prompts):
        length = rng.randint(*prompt_len)
        prompts.append([rng.randrange(LOWEST_PROMPT_ID, vocab_size) for _ in range(length)])
        outputs.append(rng.randint(*output_len))
    return Workload(prompts, outputs, seed, prompt_len, output_len)


def warmup_workload(workload: Workload, vocab_size: int) -> Workload:
    """A few short requests with other token ids: they load lazy code paths and the thread
    pool without warming any prefix cache for the measured prompts."""
    count = min(4, len(workload.prompts))
    return make_workload(count, workload.seed + 10_007, (16, 48), (4, 8), vocab_size)


# --------------------------------------------------------------------------- results


@dataclass
class SystemResult:
    """One system's measurement; ``outputs`` (token ids) stay out of the JSON."""

    system: str
    config: dict[str, Any]
    wall_s: float | None = None
    wall_s_all: list[float] = field(default_factory=list)
    output_tokens: int = 0
    output_tok_s: float | None = None
    produced_tokens_ok: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "wall_s": self.wall_s,
            "wall_s_all": self.wall_s_all,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "produced_tokens_ok": self.produced_tokens_ok,
            "config": self.config,
            "extra": self.extra,
            "error": self.error,
        }


# --------------------------------------------------------------------------- systems


class System:
    """One engine under test: load once, ``generate`` any number of times, ``close``.

    Every system is loaded before any is timed so that rounds can interleave them
    (kvrelay, HF continuous, HF static, then again): load from other users of a shared
    machine then drifts over all of them alike instead of over one.
    """

    name = ""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    def generate(self, workload: Workload) -> list[list[int]]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop background threads; the model goes with the object."""


def kvrelay_options(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    """Engine options for CPU: room for every request at once (no preemption), and a token
    budget per step that keeps prefill matmuls large enough to use the cores while a
    long prompt does not stall the running decodes for long."""
    max_len = max(len(p) for p in workload.prompts) + max(workload.output_lens)
    return {
        "max_num_seqs": args.max_num_seqs or len(workload.prompts),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_memory": int(args.kv_cache_gib * (1 << 30)),
        "enable_prefix_caching": not args.no_prefix_caching,
        "enable_chunked_prefill": True,
        "max_model_len": max_len,
    }


class KvrelaySystem(System):
    """kvrelay's offline API: one ``LLM.generate`` call with per-request sampling params."""

    name = "kvrelay"

    def __init__(self, model: str, workload: Workload, args: argparse.Namespace) -> None:
        super().__init__()
        from kvrelay_worker import LLM

        options = kvrelay_options(args, workload)
        self.llm = LLM(model, device="cpu", dtype="float32", **options)
        self.config = {"device": "cpu", "dtype": "float32", **options,
                       "block_size": self.llm.engine.config.block_size}
        self.extra["num_kv_blocks"] = getattr(self.llm.engine.runner, "num_blocks", None)

    def generate(self, workload: Workload) -> list[list[int]]:
        from kvrelay_worker import SamplingParams

        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                  for n in workload.output_lens]
        return [list(o.token_ids) for o in self.llm.generate(workload.prompts, params)]


def _load_hf(folder: Path, attn_implementation: str | None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()


def hf_continuous_config(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    """Continuous batching options for CPU. Left alone, the manager sizes its cache from 60%
    of free RAM and batches up to 8192 tokens, and its attention mask (batch tokens x every
    token readable in the cache) would take gigabytes; these give it room for the whole
    workload at once (as kvrelay has) and a token budget that suits two cores. Flash
    attention and CUDA graphs do not exist on CPU, so attention is SDPA (or paged eager)
    over the packed batch with a mask."""
    page = args.hf_page_size
    longest = max(len(p) for p in workload.prompts) + max(workload.output_lens)
    per_request = -(-longest // page)
    return {
        "attn_implementation": args.hf_attn,
        "page_size": page,
        "num_blocks": args.hf_num_blocks or per_request * len(workload.prompts) + 2,
        "max_batch_tokens": args.hf_max_batch_tokens,
        "max_requests_per_batch": args.hf_max_requests_per_batch or len(workload.prompts),
        "allow_block_sharing": False,  # random prompts share no prefix
        "use_cuda_graph": False,
        "auto_switch_to_flash": False,
        "default_compile_level": 0,
    }


class HFContinuousSystem(System):
    """transformers' continuous batching manager, each request with its own max_new_tokens."""

    name = "hf-continuous"

    def __init__(self, folder: Path, workload: Workload, args: argparse.Namespace) -> None:
        super().__init__()
        import torch
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        options = hf_continuous_config(args, workload)
        self.config = {"dtype": "float32", "do_sample": False, "eos_token_id": -1, **options}
        self.model = _load_hf(folder, options["attn_implementation"])
        cb_options = {k: v for k, v in options.items() if k != "attn_implementation"}
        generation_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                                             max_new_tokens=max(workload.output_lens))
        hints = WorkloadHints(max_prompt_length=max(len(p) for p in workload.prompts),
                              max_generated_length=max(workload.output_lens),
                              num_requests=len(workload.prompts))
        # The manager's thread runs in the inference mode of the thread that starts it.
        with torch.inference_mode():
            self.manager = self.model.init_continuous_batching(
                generation_config=generation_config,
                continuous_batching_config=ContinuousBatchingConfig(**cb_options),
                workload_hints=hints)
            self.manager.start()

    def generate(self, workload: Workload) -> list[list[int]]:
        ids = [self.manager.add_request(p, max_new_tokens=n)
               for p, n in zip(workload.prompts, workload.output_lens, strict=True)]
        done: dict[str, list[int]] = {}
        while len(done) < len(ids):
            out = self.manager.get_result(timeout=1)
            if out is None:
                if not self.manager.is_running():
                    raise RuntimeError("the continuous batching thread stopped")
                continue
            if out.is_finished():
                if out.error is not None:
                    raise RuntimeError(f"request {out.request_id}: {out.error}")
                done[out.request_id] = list(out.generated_tokens)
        if not self.extra:
            resolved = self.manager.continuous_batching_config
            self.extra["resolved_config"] = {
                k: _jsonable(getattr(resolved, k, None)) for k in (
                    "page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch",
                    "max_blocks_per_request", "use_async_batching", "use_cuda_graph",
                    "scheduler_type")}
            self.extra["attn_implementation_used"] = self.model.config._attn_implementation
        return [done[i] for i in ids]

    def close(self) -> None:
        self.manager.stop(block=True, timeout=30)
        self.model.destroy_cached_continuous_batching_manager()


class HFStaticSystem(System):
    """One left-padded ``generate`` over every prompt up to the longest requested output."""

    name = "hf-static"

    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        super().__init__()
        self.model = _load_hf(folder, args.hf_static_attn)
        self.config = {"dtype": "float32",
                       "attn_implementation": self.model.config._attn_implementation,
                       "padding": "left", "max_new_tokens": "max(n_i)", "do_sample": False,
                       "eos_token_id": None}

    def generate(self, workload: Workload) -> list[list[int]]:
        import torch

        width = max(len(p) for p in workload.prompts)
        ids = torch.zeros(len(workload.prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(workload.prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask,
                                      max_new_tokens=max(workload.output_lens),
                                      do_sample=False, eos_token_id=None, pad_token_id=0)
        self.extra["padded_prompt_tokens"] = width * len(workload.prompts)
        self.extra["generated_tokens_incl_unrequested"] = (
            max(workload.output_lens) * len(workload.prompts))
        return [out[row, width:width + n].tolist()
                for row, n in enumerate(workload.output_lens)]


def measure(systems: list[System], workload: Workload, warm: Workload, rounds: int,
            results: dict[str, SystemResult]) -> None:
    """Warm every system up (untimed), then time ``rounds`` rounds that take the systems in
    turn. A failing system is recorded and skipped from then on."""
    live = []
    for system in systems:
        try:
            system.generate(warm)
            live.append(system)
        except Exception as exc:
            results[system.name].error = f"warm-up: {type(exc).__name__}: {exc}"
    for round_index in range(rounds):
        for system in list(live):
            result = results[system.name]
            gc.collect()
            try:
                start = time.perf_counter()
                outputs = system.generate(workload)
                wall = time.perf_counter() - start
            except Exception as exc:
                result.error = f"{type(exc).__name__}: {exc}"
                live.remove(system)
                continue
            result.wall_s_all.append(wall)
            result.outputs = outputs
            print(f"  round {round_index + 1}/{rounds} {system.name}: {wall:.2f} s, "
                  f"{workload.total_output_tokens / wall:.1f} output tok/s", flush=True)
    for system in live:
        result = results[system.name]
        result.config, result.extra = system.config, system.extra
        result.wall_s = statistics.median(result.wall_s_all)
        result.output_tokens = workload.total_output_tokens
        result.output_tok_s = workload.total_output_tokens / result.wall_s
        result.produced_tokens_ok = [len(o) for o in result.outputs] == workload.output_lens


# --------------------------------------------------------------------------- report


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far two systems' greedy tokens agree: exact requests and the common prefix share.
    Random-id prompts leave near-ties in the logits, so batched float32 arithmetic in a
    different order may flip a token late in a long output; a difference in the first
    tokens, or in most requests, would be a bug."""
    prefixes, identical = [], 0
    first_diff: list[int | None] = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        identical += int(n == len(x) == len(y))
        prefixes.append(n / max(len(x), 1))
        first_diff.append(None if n == len(x) == len(y) else n)
    return {
        "requests": len(prefixes),
        "identical": identical,
        "mean_common_prefix": statistics.fmean(prefixes) if prefixes else 0.0,
        "first_difference": first_diff,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def print_table(results: list[SystemResult], kvrelay_tok_s: float | None) -> None:
    print()
    print(f"{'system':<15}{'wall s':>9}{'output tok/s':>15}{'kvrelay / this':>16}")
    for r in results:
        if r.output_tok_s is None:
            print(f"{r.system:<15}{'-':>9}{'-':>15}{'-':>16}   error: {r.error}")
            continue
        ratio = f"{kvrelay_tok_s / r.output_tok_s:.2f}x" if kvrelay_tok_s else "-"
        print(f"{r.system:<15}{r.wall_s:>9.2f}{r.output_tok_s:>15.1f}{ratio:>16}")


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


# --------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    doc = __doc__ or "offline throughput"
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="known model name, Hugging Face folder or .gguf (default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 64 (8 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/offline.json")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--quick", action="store_true",
                        help="8 prompts of 16-64 tokens asking for 8-32 tokens (smoke test)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed rounds, each running every system in turn; the median "
                             "wall time counts (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--check-requests", type=int, default=None,
                        help="compare greedy tokens on this many requests (default: all)")
    kv = parser.add_argument_group("kvrelay engine options")
    kv.add_argument("--max-num-seqs", type=int, default=None,
                    help="default: the number of prompts (every request runs at once)")
    kv.add_argument("--max-num-batched-tokens", type=int, default=512)
    kv.add_argument("--kv-cache-gib", type=float, default=2.0)
    kv.add_argument("--no-prefix-caching", action="store_true")
    hf = parser.add_argument_group("Hugging Face options")
    hf.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"],
                    help="attention for continuous batching (eager runs as paged|eager)")
    hf.add_argument("--hf-page-size", type=int, default=64)
    hf.add_argument("--hf-num-blocks", type=int, default=None,
                    help="default: enough pages for every request at once")
    hf.add_argument("--hf-max-batch-tokens", type=int, default=512)
    hf.add_argument("--hf-max-requests-per-batch", type=int, default=None,
                    help="default: the number of prompts")
    hf.add_argument("--hf-static-attn", default="sdpa", choices=["sdpa", "eager"])
    args = parser.parse_args(argv)
    if args.num_prompts is None:
        args.num_prompts = 8 if args.quick else 64
    args.prompt_len = (16, 64) if args.quick else (32, 256)
    args.output_len = (8, 32) if args.quick else (32, 128)
    return args


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

    report = {
        "benchmark": "offline",
        "model": args.model,
        "model_folder": str(folder),
        "options": {k: _jsonable(v) for k, v in vars(args).items()},
        "machine": machine_info(),
        "workload": workload.describe(),
        "results": [r.to_json() for r in ordered],
        "summary": summary,
        "agreement": checks,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = out.with_suffix(".png")
    title = (f"{args.model}, CPU fp32, {len(workload.prompts)} prompts, "
             f"{workload.total_output_tokens} output tokens")
    write_plot(png, ordered, title)
    print(f"\nwrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
