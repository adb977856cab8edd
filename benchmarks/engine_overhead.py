"""The engine's own (host) time: a tiny random model, so the model costs almost nothing
and what is timed is scheduling, input preparation, sampling and bookkeeping.

64 greedy requests (32-256 prompt tokens, 32-128 output tokens, seeded), one
``LLM.generate`` per round, torch on one thread; the median of ``--rounds`` after a
warm-up round. Precise to about 1% on a quiet machine, so it shows a change in the
engine's per-step work that the SmolLM2 benchmarks' noise would hide.

    python benchmarks/engine_overhead.py [--folder /tmp/kvrelay-tiny] [--out FILE]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Any

from harness import print_report, write_result
from harness.tiny_model import make_tiny_model


def measure(folder: Path, rounds: int, seed: int) -> dict[str, Any]:
    import torch

    import kvrelay_worker
    from kvrelay_worker import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(str(folder), device="cpu", dtype="float32", max_num_batched_tokens=512)
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(32, 256))]
               for _ in range(64)]
    lengths = [rng.randrange(32, 128) for _ in range(64)]

    def once() -> float:
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
        start = time.perf_counter()
        llm.generate(prompts, params)
        return time.perf_counter() - start

    once()  # warm-up
    times = [once() for _ in range(rounds)]
    median = statistics.median(times)
    return {"engine": str(Path(kvrelay_worker.__file__).parent), "requests": 64,
            "output_tokens": sum(lengths), "rounds_s": [round(t, 3) for t in times],
            "median_s": round(median, 3), "output_tok_s": round(sum(lengths) / median, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/kvrelay-tiny-llama",
                        help="the tiny model (written there if missing)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the tiny model and stop")
    parser.add_argument("--out", default="benchmarks/results/engine_overhead.json")
    args = parser.parse_args()
    folder = Path(args.folder)
    if not (folder / "config.json").is_file():
        make_tiny_model(folder)
    if args.prepare_only:
        return
    result = measure(folder, args.rounds, args.seed)
    print_report(result)
    write_result(args.out, "engine_overhead", args, result)


if __name__ == "__main__":
    main()
