"""The first start of the default model on a CPU: time, cache written, peak memory.

What ``kvrelay worker`` / ``kvrelay up`` do on a machine whose cache is empty, each in a
fresh Python process (imports included, as a user's start pays them), with
``KVRELAY_CACHE_DIR`` an empty folder:

- ``kept``: today's path. ``prepare_if_needed`` with the CPU worker's settings (nothing
  to convert: the GGUF is read as it is), then the engine loads the GGUF's quantized
  blocks (``quantization="auto"`` on a CPU).
- ``converted``: the path before the GGUF was kept without a copy. The GGUF is first
  converted into a float32 Hugging Face folder in the cache (``prepare_model``: what
  every first start did), then the engine loads the GGUF's blocks as above.

Each row: wall seconds from the process start to a ready engine (median of
``--repeats``, alternating), bytes the start left in the cache, the process's peak
resident memory, and the engine's resident weight bytes (the ratio of the two bounds
what loading costs beyond the weights; the process's own imports are part of it, so
the import-only process's peak is given too).

    .venv/bin/python benchmarks/first_start.py [--repeats 3] [--checkout /tmp/before]

(``git worktree add /tmp/before <commit>`` makes the older checkout; its rows are named
``... (checkout)``, and ``speedup`` is ``kept`` against its converting start.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import write_result

MODEL = "smollm2-135m-instruct"
CHILD = r"""
import json, resource, sys, time
began = time.perf_counter()
import torch
from kvrelay.cli.worker_launch import prepare_if_needed
from kvrelay_worker.engine import LLMEngine
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.loading import prepare_model
mode, model = sys.argv[1], sys.argv[2]
imported = time.perf_counter() - began
peak_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if mode == "converted":
    prepare_model(model, progress=False)
else:
    prepare_if_needed(model, {"KVRELAY_DEVICE": "cpu", "KVRELAY_QUANTIZATION": "auto"})
engine = LLMEngine(EngineConfig(model=model, device="cpu", quantization="auto",
                                max_model_len=2048))
ready = time.perf_counter() - began
weights = sum(t.numel() * t.element_size() for t in engine.runner.model.state_dict().values())
print(json.dumps({"seconds": ready, "import_seconds": imported, "weight_bytes": weights,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_rss_imports": peak_imports,
                  "quantization": engine.config.quantization}))
"""
MODES = ("kept", "converted")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def one_start(mode: str, checkout: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvrelay-first-start-") as cache:
        env = {**os.environ, "KVRELAY_CACHE_DIR": cache}
        if checkout is not None:  # another commit's packages ahead of the installed ones
            env["PYTHONPATH"] = os.pathsep.join(
                str(checkout / part) for part in ("client", "worker", "kernels"))
        done = subprocess.run([sys.executable, "-c", CHILD, mode, MODEL], env=env,
                              capture_output=True, text=True, check=True)
        row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        row["cache_bytes"] = folder_bytes(Path(cache))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkout", type=Path,
                        help="also time another checkout of the project (a git worktree of "
                             "an older commit) with this environment's packages, alternating")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "measured" / "cpu-first-start.json")
    args = parser.parse_args()
    systems: list[tuple[str, str, Path | None]] = [(mode, mode, None) for mode in MODES]
    if args.checkout:
        systems += [(f"{mode} (checkout)", mode, args.checkout) for mode in MODES]
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in systems}
    for repeat in range(args.repeats):
        for name, mode, checkout in systems if repeat % 2 == 0 else systems[::-1]:
            samples[name].append(one_start(mode, checkout))
            print(f"repeat {repeat}: {name} {samples[name][-1]}", flush=True)
    rows = []
    for name, runs in samples.items():
        seconds = [r["seconds"] for r in runs]
        last = runs[-1]
        rows.append({
            "mode": name, "seconds": statistics.median(seconds),
            "seconds_spread": f"{min(seconds):.2f}-{max(seconds):.2f}",
            "cache_bytes": last["cache_bytes"], "weight_bytes": last["weight_bytes"],
            "peak_rss": max(r["peak_rss"] for r in runs),
            "peak_rss_imports": max(r["peak_rss_imports"] for r in runs),
            "quantization": last["quantization"]})
    by_name = {row["mode"]: row for row in rows}
    for row in rows:
        print(f"{row['mode']:<22} {row['seconds']:6.2f} s ({row['seconds_spread']})  cache "
              f"{row['cache_bytes'] / 2**20:7.1f} MiB  peak RSS {row['peak_rss'] / 2**20:7.1f}"
              f" MiB (imports {row['peak_rss_imports'] / 2**20:.1f})  weights "
              f"{row['weight_bytes'] / 2**20:.1f} MiB")
    slowest = by_name.get("converted (checkout)", by_name["converted"])
    speedup = slowest["seconds"] / by_name["kept"]["seconds"]
    print(f"first start: kept {speedup:.2f}x faster than {slowest['mode']}")
    write_result(args.out, "first_start", args, {
        "model": MODEL, "rows": rows, "speedup": speedup, "against": slowest["mode"],
        "checkout": str(args.checkout or "")})


if __name__ == "__main__":
    main()
