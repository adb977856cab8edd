"""Quantized weights on CPU: batch-1 decode speed, 32-request throughput, resident bytes.

SmolLM2-135M-Instruct, every row of ``quant_configs.CONFIGS`` in one run (the ratios to
the float32 row are the result: absolute times drift on a shared machine):

- batch-1 decode tokens/s: one greedy request, EOS ignored; 32 / (time of 33 tokens - time
  of 1 token), so prefill is left out. Batch-1 decode reads every weight byte per token.
- 32 concurrent: 32 prompts of 16..47 tokens asking 16 tokens each, one ``generate`` call;
  output tokens / wall time (prefill included).
- resident weight bytes, and for the GGUF row the file's tensor bytes beside them.

Each row runs a warm-up first. Issue 17's targets: int8 >= 2x and int4 >= 2.5x float32 at batch 1;
32 concurrent no slower than float32.

    .venv/bin/python benchmarks/quant.py [--threads N]
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import torch
from harness import write_result
from harness.quant_configs import CONFIGS, MODEL, make_llm

from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.models.quantize_model import weight_bytes

OUT = Path(__file__).parent / "measured" / "cpu-quant.json"


def timed_generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> float:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.choices[0].token_ids) == max_tokens for o in outs)
    return elapsed


def gguf_tensor_bytes() -> int:
    from kvrelay_worker.loading import registry_model_path
    from kvrelay_worker.loading.gguf_metadata import GGUFFile

    return sum(int(t.n_bytes) for t in GGUFFile(registry_model_path(MODEL)).tensors)


def measure(label: str) -> dict[str, Any] | None:
    llm = make_llm(label, num_kv_blocks=512, max_num_seqs=32, enable_prefix_caching=False)
    if llm is None:
        return None
    one = [[(13 * i + 7) % 20000 + 100 for i in range(16)]]
    many = [[(31 * i + 17 * r) % 20000 + 100 for i in range(16 + r)] for r in range(32)]
    timed_generate(llm, one, 4)  # warm-up: compile (or load) the one-row loops
    timed_generate(llm, many[:8], 2)  # and the many-row path
    decode = 32 / (timed_generate(llm, one, 33) - timed_generate(llm, one, 1))
    concurrent = 32 * 16 / timed_generate(llm, many, 16)
    row = {"config": label, "options": CONFIGS[label], "decode_tok_s": decode,
           "concurrent32_tok_s": concurrent, "weight_bytes": weight_bytes(llm.engine.model)}
    print(f"{label}: {row}", flush=True)
    del llm
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [row for label in CONFIGS if (row := measure(label)) is not None]
    base = next(r for r in rows if r["config"] == "float32")
    print(f"\nSmolLM2 CPU, {args.threads} threads (shared machine: noisy)")
    print(f"{'config':<18} {'decode b=1 tok/s':>17} {'x f32':>6} {'32 conc tok/s':>14} "
          f"{'x f32':>6} {'weights MiB':>12}")
    for r in rows:
        r["decode_vs_float32"] = r["decode_tok_s"] / base["decode_tok_s"]
        r["concurrent32_vs_float32"] = r["concurrent32_tok_s"] / base["concurrent32_tok_s"]
        print(f"{r['config']:<18} {r['decode_tok_s']:>17.1f} {r['decode_vs_float32']:>6.2f} "
              f"{r['concurrent32_tok_s']:>14.1f} {r['concurrent32_vs_float32']:>6.2f} "
              f"{r['weight_bytes'] / 2**20:>12.1f}")
    file_bytes = gguf_tensor_bytes()
    kept = next((r for r in rows if r["options"].get("quantization") == "gguf"), None)
    if kept is not None:
        print(f"GGUF file tensor bytes {file_bytes / 2**20:.1f} MiB; kept-quantized resident "
              f"weights {kept['weight_bytes'] / 2**20:.1f} MiB = "
              f"{kept['weight_bytes'] / file_bytes:.3f}x (target <= 1.3x)")
    write_result(args.out, "quant", args, {"model": MODEL, "threads": args.threads,
                                           "gguf_tensor_bytes": file_bytes, "rows": rows})


if __name__ == "__main__":
    main()
