"""The offline benchmark's parts that ``offline.py`` and ``long_context.py`` share: the
workload, the three systems (kvrelay, Hugging Face continuous batching, static
``generate``), the timing loop, greedy agreement and the command-line options."""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results import jsonable

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
        # Float weights, as the other systems compute with (LLM's default keeps a GGUF's).
        options = {"quantization": "none", **options}
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
                k: jsonable(getattr(resolved, k, None)) for k in (
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


def print_table(results: list[SystemResult], kvrelay_tok_s: float | None) -> None:
    print()
    print(f"{'system':<15}{'wall s':>9}{'output tok/s':>15}{'kvrelay / this':>16}")
    for r in results:
        if r.output_tok_s is None:
            print(f"{r.system:<15}{'-':>9}{'-':>15}{'-':>16}   error: {r.error}")
            continue
        ratio = f"{kvrelay_tok_s / r.output_tok_s:.2f}x" if kvrelay_tok_s else "-"
        print(f"{r.system:<15}{r.wall_s:>9.2f}{r.output_tok_s:>15.1f}{ratio:>16}")


def parse_args(argv: Sequence[str] | None,
               parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The workload's, kvrelay's and Hugging Face's options, added to ``parser`` (which
    holds the script's own, such as ``--out``)."""
    parser = parser or argparse.ArgumentParser(description="offline throughput")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="known model name, Hugging Face folder or .gguf (default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 64 (8 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
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


def serving_engine_options(workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """``serve.py``'s engine, the same for both of its paths (``gateway.py`` serves it
    too): every request fits at once, 512-token steps."""
    return {
        "max_num_seqs": len(workload.prompts),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": 1024,
        "kv_cache_memory": 2 << 30,
    }
