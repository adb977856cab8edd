"""LoRA serving cost on CPU: concurrent requests over 4 adapters against the base model alone.

One workload, three systems, offline engines (``LLMEngine``) in one process: ``--requests``
prompts (32) of random ordinary token ids, lengths uniform in 32..128, each asking for
``--max-tokens`` output tokens with EOS ignored, greedy, float32, prefix caching off (so
repeated rounds do the same work), every request added at once:

- ``base``: the base model with LoRA off (``max_loras=0``): the baseline.
- ``base-lora-on``: the same requests on an engine with 4 adapter slots and 4 adapters
  loaded, none named: what enabling LoRA costs a batch without adapters (expected ~1.0x).
  Its greedy tokens must equal ``base``'s.
- ``4-adapters``: the same engine, the requests spread round robin over the 4 adapters,
  all running in the same steps (PEFT adapters made by ``peft`` on the base weights:
  rank ``--rank``, all seven projections, random non-zero B).

Output tokens/s = output tokens / wall time from the first ``add_request`` to the last
token. The systems alternate for ``--repeats`` rounds after a warm-up; the median round
counts, with its ratio to ``base``. Prints a table and writes JSON.

    python benchmarks/lora.py                      # SmolLM2, 32 requests (minutes)
    python benchmarks/lora.py --quick              # tiny random model, 8 short requests
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import write_result
from harness.tiny_model import make_tiny_model

NUM_ADAPTERS = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SYSTEMS = ("base", "base-lora-on", "4-adapters")


def make_adapters(base: Path, rank: int, root: Path) -> list[Path]:
    """``NUM_ADAPTERS`` PEFT adapters of ``base`` (made once, kept under ``root``)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folders = []
    for seed in range(NUM_ADAPTERS):
        folder = root / f"{base.name}-r{rank}-s{seed}"
        if not (folder / "adapter_model.safetensors").is_file():
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            torch.manual_seed(seed)
            config = LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS,
                                init_lora_weights=False, lora_dropout=0.0)
            get_peft_model(model, config).save_pretrained(str(folder))
        folders.append(folder)
    return folders


def make_workload(num: int, seed: int) -> list[list[int]]:
    """``num`` prompts of random ordinary token ids, 32 to 128 long."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 20000) for _ in range(rng.randint(32, 128))]
            for _ in range(num)]


def run_round(engine: Any, prompts: list[list[int]], loras: list[str | None],
              max_tokens: int, tag: str) -> tuple[float, list[list[int]]]:
    """Wall seconds of one round and each request's tokens."""
    from kvrelay_worker.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"{tag}-{i}", prompt, params, lora=lora)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.output is not None:
                tokens[out.request_id] = out.output.choices[0].token_ids
    wall = time.perf_counter() - start
    return wall, [tokens[f"{tag}-{i}"] for i in range(len(prompts))]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny random model, 8 requests of 8 tokens, one round")
    parser.add_argument("--out", default="benchmarks/results/lora.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.repeats = 8, 8, 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from kvrelay_worker.engine import EngineConfig, LLMEngine
    from kvrelay_worker.loading import prepare_model

    if args.threads:
        torch.set_num_threads(args.threads)
    scratch = Path(tempfile.gettempdir()) / "kvrelay-lora-bench"
    base = (make_tiny_model(scratch / "tiny") if args.quick
            else prepare_model(args.model, progress=False))
    adapters = make_adapters(base, args.rank, scratch)
    prompts = make_workload(args.requests, args.seed)
    blocks = args.requests * -(-(128 + args.max_tokens) // 16) + 16
    common = {"model": str(base), "device": "cpu", "dtype": "float32",
              "enable_prefix_caching": False, "num_kv_blocks": blocks,
              "max_num_seqs": max(args.requests, 1), "max_lora_rank": max(args.rank, 16)}
    plain = LLMEngine(EngineConfig(**common))
    lora = LLMEngine(EngineConfig(**common, max_loras=NUM_ADAPTERS))
    names = [f"adapter-{i}" for i in range(NUM_ADAPTERS)]
    for name, folder in zip(names, adapters, strict=True):
        lora.add_lora(name, folder)
    runs: dict[str, tuple[LLMEngine, list[str | None]]] = {
        "base": (plain, [None] * len(prompts)),
        "base-lora-on": (lora, [None] * len(prompts)),
        "4-adapters": (lora, [names[i % NUM_ADAPTERS] for i in range(len(prompts))]),
    }
    print(f"model {args.model if not args.quick else 'tiny random'} ({base}), CPU float32, "
          f"{torch.get_num_threads()} threads; {len(prompts)} requests x {args.max_tokens} "
          f"tokens; {NUM_ADAPTERS} adapters of rank {args.rank}", flush=True)
    for name, (engine, loras) in runs.items():  # warm-up: a short round of each
        run_round(engine, prompts[:4], loras[:4], 4, f"warm-{name}")
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.repeats):
        for name, (engine, loras) in runs.items():
            wall, outputs[name] = run_round(engine, prompts, loras, args.max_tokens,
                                            f"{name}-{r}")
            rounds[name].append(sum(map(len, outputs[name])) / wall)
    median = {name: statistics.median(values) for name, values in rounds.items()}
    same_base = outputs["base"] == outputs["base-lora-on"]
    print(f"\n| system | output tok/s (median of {args.repeats}) | vs base |")
    print("|---|---:|---:|")
    for name in runs:
        print(f"| {name} | {median[name]:.1f} | {median[name] / median['base']:.3f}x |")
    print(f"\nbase tokens identical with LoRA on: {same_base}; adapter slot loads: "
          f"{lora.loras.num_slot_loads if lora.loras else 0}")
    write_result(args.out, "lora", args, {
        "model": "tiny" if args.quick else args.model, "requests": len(prompts),
        "rank": args.rank, "adapters": NUM_ADAPTERS, "rounds": rounds,
        "base_tok_s": median["base"], "base_lora_on_tok_s": median["base-lora-on"],
        "adapters_tok_s": median["4-adapters"],
        "lora_on_vs_base": median["base-lora-on"] / median["base"],
        "adapters_vs_base": median["4-adapters"] / median["base"],
        "base_tokens_identical": same_base})
    return 0 if same_base else 1


if __name__ == "__main__":
    sys.exit(main())
