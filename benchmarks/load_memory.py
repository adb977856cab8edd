"""Host memory a model load takes beyond the weights it keeps, for each way a model loads.

Each row loads one model in a fresh Python process (``--repeats`` times: the median run
is kept, the spread of its peak given) (imports and the tokenizer done first,
outside the measure) and measures ``build_model_for`` alone, the step that reads the
weights: the process's peak resident memory during it (Linux's high-water mark, reset
just before through ``/proc/self/clear_refs``: exact, no sampling) and its resident memory
after it, both as growth over the resident memory before it, against the engine's weight
bytes (each tensor once: tied embeddings count once). ``peak_ratio`` is the acceptance
figure of "peak host memory while loading within ~1.2x the final weights". The anonymous
(heap) part is given apart from file-backed pages. The CPU kernels' library is loaded before
the measure: code, mapped once per process whatever the model.

Rows: the default registry model as a CPU worker loads it (its GGUF, blocks kept), and the
same weights as a float32 Hugging Face folder (``kvrelay models prepare``'s conversion) loaded
float, int8 and int4 (quantized at load); ``--folder`` adds other folders, such as the
pre-quantized checkpoints the tests make with llmcompressor
(``$KVRELAY_CACHE_DIR/quant-checkpoints/*/W4A16-g64``).

    .venv/bin/python benchmarks/load_memory.py [--out benchmarks/results/load_memory.json]
    .venv/bin/python benchmarks/load_memory.py --checkout /tmp/before   # also an older commit

(``git worktree add /tmp/before <commit>`` makes the older checkout; its rows are marked
``(checkout)``.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import write_result

MODEL = "smollm2-135m-instruct"
CHILD = r"""
import json, sys
import torch
from kvrelay_worker.engine import engine_model, llm_engine
from kvrelay_worker.engine import LLMEngine
from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out

record = {}
build = engine_model.build_model_for
def measured(config, files, max_len):
    files.config
    load_cpu_kernels()  # code, not loading: its library is mapped before the measure
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the resident memory now
    before = status()
    model = build(config, files, max_len)
    after = status()
    record.update(before=before, after=after, weight_bytes=weight_bytes(model))
    return model
llm_engine.build_model_for = measured
model, quantization = sys.argv[1], sys.argv[2]
LLMEngine(EngineConfig(model=model, device="cpu", quantization=quantization,
                       max_model_len=128, kv_cache_memory=8 << 20))
print(json.dumps(record))
"""


def one_load(model: str, quantization: str, env: dict[str, str],
             checkout: Path | None = None) -> dict[str, Any]:
    if checkout is not None:  # another commit's packages ahead of the installed ones
        env = {**env, "PYTHONPATH": os.pathsep.join(
            str(checkout / part) for part in ("client", "worker", "kernels"))}
    done = subprocess.run([sys.executable, "-c", CHILD, model, quantization], env=env,
                          capture_output=True, text=True, check=True)
    record = json.loads(done.stdout.strip().splitlines()[-1])
    before, after, weights = record["before"], record["after"], record["weight_bytes"]
    peak = after["VmHWM"] - before["VmRSS"]
    return {
        "weights_mib": round(weights / 2**20, 1),
        "peak_growth_mib": round(peak / 2**20, 1),
        "peak_ratio": round(peak / weights, 3),
        "after_growth_mib": round((after["VmRSS"] - before["VmRSS"]) / 2**20, 1),
        "after_anon_growth_mib": round((after["RssAnon"] - before["RssAnon"]) / 2**20, 1),
        "after_file_growth_mib": round((after["RssFile"] - before["RssFile"]) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--checkout", type=Path,
                        help="also measure another checkout of the project (a git worktree "
                             "of an older commit) with this environment's packages")
    parser.add_argument("--folder", action="append", default=[], metavar="LABEL=PATH",
                        help="also load this folder as a worker would (quantization auto): "
                             "a pre-quantized checkpoint, say; may be repeated")
    parser.add_argument("--repeats", type=int, default=3,
                        help="loads per row, each in a fresh process; the median is kept")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "load_memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvrelay-load-memory-") as cache:
        env = {**os.environ, "KVRELAY_CACHE_DIR": cache}
        prepare = "from kvrelay_worker.loading import prepare_model; " \
                  f"print(prepare_model({MODEL!r}, progress=False))"
        folder = subprocess.run([sys.executable, "-c", prepare], env=env, capture_output=True,
                                text=True, check=True).stdout.strip().splitlines()[-1]
        loads = [("GGUF, blocks kept (CPU default)", MODEL, "auto"),
                 ("float32 folder, float", folder, "none"),
                 ("float32 folder, int8 at load", folder, "int8"),
                 ("float32 folder, int4 at load", folder, "int4")]
        for extra in args.folder:
            label, _, path = extra.partition("=")
            loads.append((label, path, "auto"))
        rows = []
        for label, model, quantization in loads:
            for checkout in [None, args.checkout] if args.checkout else [None]:
                name = label if checkout is None else f"{label} (checkout)"
                runs = [one_load(model, quantization, env, checkout)
                        for _ in range(args.repeats)]
                runs.sort(key=lambda run: run["peak_growth_mib"])
                peaks = [run["peak_growth_mib"] for run in runs]
                row = {"load": name, **runs[len(runs) // 2],
                       "peak_spread_mib": f"{peaks[0]}-{peaks[-1]}"}
                print(row, flush=True)
                rows.append(row)
    write_result(args.out, "load_memory", args, {"model": MODEL, "rows": rows,
                                                  "checkout": str(args.checkout or "")})


if __name__ == "__main__":
    main()
