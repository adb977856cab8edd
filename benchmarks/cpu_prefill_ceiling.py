"""How close a CPU prefill runs to the core's multiply-add peak (SmolLM2 kept Q4_1, 1 thread).

A takeover survivor re-prefills its dead peer's streams on its own thread
(``benchmarks/takeover.py``: one torch thread per worker), so one core's multiply-add
throughput bounds how fast it can. Two measurements in one run:

- peak: ``harness/madd_peak.c``, compiled with the system's C compiler at
  ``-march=native``, times each multiply-add instruction the CPU kernels build on, issued
  into 12 independent accumulators so that only throughput counts: int16 pairs (AVX-512
  VNNI ``vpdpwssd``; AVX2 ``vpmaddwd`` + add), int8 quads (what int8 activations would
  give) and float32 FMA; and the int16 GEMM's tile with its weights held in registers
  (pair products, then per block of 32 inputs a conversion, a scale product and two
  multiply-adds per accumulator): the fastest its arithmetic allows;
- prefill: ``--prompts`` fresh prompts of ``--tokens`` random tokens through
  ``LLM(cpu_threads=1)`` (the worker's defaults otherwise: the GGUF's Q4_1 blocks kept) at
  ``max_tokens=1``, ``--repeats`` timed runs, then one more under ``torch.profiler``.

Work is counted from the model's config (``harness.model_work``): the decoder's matmuls
(served by the int16 GEMM) and causal attention's ``Q K^T`` and ``P V`` (float32).
Reported: each family's share of the profiled time, its achieved GMAC/s against its
instruction's peak, and the ceilings: tokens/s if every multiply-add ran at that peak and
nothing else took time, with int16 matmuls (the precision the kernels keep), with int8,
and with the int16 matmuls at the GEMM tile's own rate (``block``).

    .venv/bin/python benchmarks/cpu_prefill_ceiling.py --out benchmarks/results/prefill-ceiling.json
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import write_result
from harness.model_work import attention_flops, matmul_params_per_token

MODEL = "smollm2-135m-instruct"
LOWEST_PROMPT_ID = 100  # ordinary SmolLM2 token ids, as benchmarks/offline.py draws them
PEAK_SOURCE = Path(__file__).parent / "harness" / "madd_peak.c"
# Profiler op -> family whose multiply-adds it performs
FAMILIES = {"kvrelay_cpu::int16_gemm": "matmul", "kvrelay_cpu::paged_attention_tiled": "attention"}


def instruction_peaks() -> dict[str, dict[str, float]]:
    """Per multiply-add instruction of this core: multiply-adds per instruction, and
    instructions and multiply-adds (G) per second."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("no C compiler on PATH: the peak loop cannot be built")
    with tempfile.TemporaryDirectory() as folder:
        binary = Path(folder) / "madd_peak"
        subprocess.run([compiler, "-O2", "-march=native", str(PEAK_SOURCE), "-o", str(binary)],
                       check=True)
        lines = subprocess.run([str(binary)], check=True, capture_output=True,
                               text=True).stdout.split("\n")
    peaks = {}
    for line in filter(None, lines):
        name, macs, per_s = line.split()
        peaks[name] = {"macs_per_instruction": int(macs), "instructions_per_s": float(per_s),
                       "gmacs": int(macs) * float(per_s) / 1e9}
    return peaks


def peak_of(peaks: dict[str, dict[str, float]], kind: str) -> float:
    """GMAC/s of the int16, int8 or float32 instruction, or of the int16 GEMM's tile
    (``block``), whichever level was built."""
    prefixes = {"int16": ("vpdpwssd", "vpmaddwd+"), "int8": ("vpdpbusd", "vpmaddubsw"),
                "float32": ("vfmadd231ps",), "block": ("int16-gemm-block",)}[kind]
    return next(p["gmacs"] for name, p in peaks.items() if name.startswith(prefixes))


def fresh_prompts(rng: random.Random, count: int, tokens: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(LOWEST_PROMPT_ID, vocab) for _ in range(tokens)]
            for _ in range(count)]


def time_prefill(llm: Any, prompts: list[list[int]]) -> float:
    from kvrelay_worker.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start


def profiled_seconds(llm: Any, prompts: list[list[int]]) -> tuple[float, dict[str, float]]:
    """One prefill under torch.profiler: its wall time and each family's op time."""
    from torch.profiler import profile

    with profile() as prof:
        wall = time_prefill(llm, prompts)
    seconds = {"matmul": 0.0, "attention": 0.0, "other ops": 0.0}
    for event in prof.key_averages():
        if "::" not in event.key:
            continue  # Python-side ranges, not ops
        seconds[FAMILIES.get(event.key, "other ops")] += event.self_cpu_time_total / 1e6
    return wall, seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=352,
                        help="tokens per prompt (takeover.py re-prefills ~352 a stream)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    peaks = instruction_peaks()
    from kvrelay_worker.engine.llm import LLM

    llm = LLM(MODEL, cpu_threads=1)
    config = llm.engine.model.config
    rng = random.Random(args.seed)
    vocab = config.vocab_size

    def batch() -> list[list[int]]:
        return fresh_prompts(rng, args.prompts, args.tokens, vocab)

    time_prefill(llm, fresh_prompts(rng, 1, 64, vocab))  # warm-up: packs, first calls
    tokens = args.prompts * args.tokens
    walls = [time_prefill(llm, batch()) for _ in range(args.repeats)]
    profiled_wall, seconds = profiled_seconds(llm, batch())
    seconds["outside ops"] = max(0.0, profiled_wall - sum(seconds.values()))

    causal = args.prompts * args.tokens * (args.tokens + 1) // 2
    gmac = {"matmul": tokens * matmul_params_per_token(config) / 1e9,
            "attention": attention_flops(config, causal) / 2 / 1e9}
    peak = {"matmul": peak_of(peaks, "int16"), "attention": peak_of(peaks, "float32")}
    block_peak = peak_of(peaks, "block")

    def ceiling_at(matmul_gmacs: float) -> float:
        """Tokens/s with the matmuls at ``matmul_gmacs``, attention at its instruction's
        peak and nothing else taking time."""
        return tokens / (gmac["matmul"] / matmul_gmacs + gmac["attention"] / peak["attention"])

    families = {}
    for name, share in seconds.items():
        row: dict[str, Any] = {"seconds": share, "share": share / profiled_wall}
        if name in gmac:
            row.update(gmac=gmac[name], gmacs=gmac[name] / share, peak_gmacs=peak[name],
                       of_peak=gmac[name] / share / peak[name])
        if name == "matmul":
            row.update(block_peak_gmacs=block_peak, of_block_peak=gmac[name] / share / block_peak)
        families[name] = row
    tok_s = tokens / statistics.median(walls)
    figures = {  # in the order benchmarks/README.md's table shows them
        "prefill": {"tokens": tokens, "tok_s": tok_s,
                    "tok_s_runs": sorted(tokens / w for w in walls),
                    "profiled_tok_s": tokens / profiled_wall},
        "ceiling_tok_s": ceiling_at(peak["matmul"]),
        "of_ceiling": tok_s / ceiling_at(peak["matmul"]),
        "ceiling_block_tok_s": ceiling_at(block_peak),
        "ceiling_int8_matmul_tok_s": ceiling_at(peak_of(peaks, "int8")),
        "families": families,
        "instruction_peaks": peaks,
    }
    print(f"prefill {args.prompts} x {args.tokens} tokens, 1 thread: {tok_s:.0f} tok/s "
          f"(runs {', '.join(f'{t:.0f}' for t in figures['prefill']['tok_s_runs'])})")
    for name, row in families.items():
        extra = (f"  {row['gmacs']:.1f} GMAC/s of {row['peak_gmacs']:.1f} "
                 f"({100 * row['of_peak']:.0f}%)" if "gmacs" in row else "")
        if "of_block_peak" in row:
            extra += (f", {100 * row['of_block_peak']:.0f}% of the tile's "
                      f"{row['block_peak_gmacs']:.1f}")
        print(f"  {name:12s} {row['seconds']:6.3f} s {100 * row['share']:5.1f}%{extra}")
    print(f"ceiling at peak: {figures['ceiling_tok_s']:.0f} tok/s (int16 matmuls), "
          f"{figures['ceiling_block_tok_s']:.0f} (at the GEMM tile's rate), "
          f"{figures['ceiling_int8_matmul_tok_s']:.0f} (int8); measured "
          f"{100 * figures['of_ceiling']:.0f}% of the int16 ceiling")
    if args.out:
        write_result(args.out, "cpu_prefill_ceiling", args, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
