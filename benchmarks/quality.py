"""Quantization quality on SmolLM2: perplexity, and teacher-forced agreement with float32.

Every row of ``quant_configs.CONFIGS`` in one run:

- perplexity over the English text of ``../shared/seeds`` (beside the repository) (lines whose characters are
  at least 95% ASCII), tokenized once and cut into fixed, non-overlapping windows of
  ``WINDOW`` tokens (the first ``--max-windows``, 12 by default: a run on a shared 2-core
  machine must finish); every token of a window after its first is scored (the count is
  printed). The float32 row is today's path: the Q4_1 GGUF dequantised to float32.
- top-1 agreement with float32, teacher-forced: float32 greedily continues each prompt of
  ``PROMPTS`` by 64 tokens; every row then predicts each of those 64 tokens from the same
  preceding tokens, so one early flip counts once, not for the rest of the continuation.
  Also the mean |logit difference| to float32 at those positions.

Issue 17's targets: int8 weights ppl <= +1%, int4 from float <= +10%; GGUF Q4_1 kept
quantized >= 99.5% top-1 agreement with the dequantised path. The last row is the kept
GGUF with every product through the integer dot-product kernel (batch-1 decode's).

    .venv/bin/python benchmarks/quality.py [--seeds DIR]
"""

from __future__ import annotations

import argparse
import gc
import math
from pathlib import Path
from typing import Any

import torch
from harness import write_result
from harness.quant_configs import CONFIGS, MODEL, make_llm
from harness.seeds_text import PROMPTS, english_text

from kvrelay_kernels import cpu_quantized_matmul
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.teacher_forcing import sequence_logits

OUT = Path(__file__).parent / "measured" / "cpu-quality.json"
# The kept GGUF again, with every product through the integer dot-product kernel (int16
# activations): the scores above run prompts, so their products take the weight-only
# kernels, while decode at batch 1 takes the integer one.
INTEGER_EVERY_ROW = "gguf-kept, int dot"
INTEGER_ROWS = dict(cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS)
WINDOW = 256
CONTINUATION = 64


def perplexity(llm: Any, windows: list[list[int]]) -> float:
    nll, count = 0.0, 0
    for window in windows:
        logits = sequence_logits(llm.engine, window)
        logprobs = torch.log_softmax(logits[:-1], dim=-1)
        targets = torch.tensor(window[1:])
        nll -= logprobs.gather(1, targets[:, None]).sum().item()
        count += len(window) - 1
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "seeds")
    parser.add_argument("--max-windows", type=int, default=12,
                        help="score only the first N windows (0: all; 7,399 tokens = 28)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    options = {"num_kv_blocks": 64, "max_num_seqs": 8, "enable_prefix_caching": False}
    rows: list[dict[str, Any]] = []
    sequences: list[list[int]] = []
    reference: list[torch.Tensor] = []
    windows: list[list[int]] = []
    runs = [(label, label, False) for label in CONFIGS]
    runs.append(("gguf-kept (Q4_1)", INTEGER_EVERY_ROW, True))
    for config, label, integer_every_row in runs:
        llm = make_llm(config, **options)
        if llm is None:
            continue
        cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS = (
            {8: 1 << 30, 4: 1 << 30} if integer_every_row else dict(INTEGER_ROWS))
        if not windows:
            ids = llm.tokenizer.encode(english_text(args.seeds), add_special_tokens=False)
            windows = [ids[i:i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]
            windows = windows[:args.max_windows or None]
        if not sequences:  # the float32 row comes first and fixes the continuations
            params = SamplingParams(max_tokens=CONTINUATION, temperature=0.0, ignore_eos=True)
            prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
            outs = llm.generate(prompts, params)
            sequences = [p + o.choices[0].token_ids for p, o in zip(prompts, outs, strict=True)]
        logits = [sequence_logits(llm.engine, s)[-CONTINUATION - 1:-1] for s in sequences]
        if not reference:
            reference = logits
        agree = sum((a.argmax(-1) == b.argmax(-1)).sum().item()
                    for a, b in zip(logits, reference, strict=True))
        delta = sum((a - b).abs().mean().item() for a, b in zip(logits, reference, strict=True))
        rows.append({"config": label, "options": CONFIGS[config],
                     "perplexity": perplexity(llm, windows),
                     "top1_agreement": agree / (CONTINUATION * len(sequences)),
                     "mean_abs_dlogit": delta / len(sequences)})
        print(f"{label}: {rows[-1]}", flush=True)
        del llm
        gc.collect()
    base = rows[0]["perplexity"]
    scored = len(windows) * (WINDOW - 1)
    print(f"\nSmolLM2 perplexity over {len(windows)} windows of {WINDOW} tokens "
          f"({scored} scored tokens) of {args.seeds}; top-1 agreement with float32 over "
          f"{len(PROMPTS)} prompts x {CONTINUATION} teacher-forced tokens")
    print(f"{'config':<18} {'perplexity':>10} {'vs f32':>8} {'top-1 agree':>12} "
          f"{'mean |dlogit|':>14}")
    for r in rows:
        r["perplexity_vs_float32"] = r["perplexity"] / base - 1
        print(f"{r['config']:<18} {r['perplexity']:>10.3f} {r['perplexity_vs_float32']:>+8.2%} "
              f"{r['top1_agreement']:>12.2%} {r['mean_abs_dlogit']:>14.4f}")
    write_result(args.out, "quality", args, {
        "model": MODEL, "window": WINDOW, "windows": len(windows), "scored_tokens": scored,
        "prompts": PROMPTS, "continuation": CONTINUATION, "rows": rows})


if __name__ == "__main__":
    main()
