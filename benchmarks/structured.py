"""Cost of structured output: a batch of 16 with a JSON schema vs the same batch unconstrained.

Both runs use one engine, the same 16 prompts, temperature 1 with per-request seeds; the
constrained run asks each request for a JSON object with a fixed-size array of integers
(long outputs, every step masked), the free run ignores EOS. Output tokens/s = generated tokens / wall time; the runs alternate for
``--repeats`` rounds and the median round counts. Every constrained output is checked to
parse. Model: SmolLM2-135M-Instruct (``--model``), or the tiny random model (``--tiny``:
the grammar's share of a step is then much larger). The free run of each round generates
exactly the token counts the constrained run produced, request by request. Writes
``benchmarks/results/structured.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import write_result
from harness.tiny_model import make_tiny_model

RESULTS = Path(__file__).resolve().parent / "results" / "structured.json"
BATCH = 16
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "scores": {"type": "array", "minItems": 24, "maxItems": 24,
                   "items": {"type": "integer", "minimum": 0, "maximum": 999}},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "scores", "ok"],
    "additionalProperties": False,
}
PROMPT = "Give a JSON record with a name, 24 scores and a flag:"


def run(llm: Any, lengths: list[int], constrained: bool) -> tuple[float, list[int], list[str]]:
    """One batch; the free run generates exactly ``lengths`` tokens per request (the
    constrained run's own lengths), so both do the same work with the same batch shape."""
    from kvrelay_worker.engine import SamplingParams

    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=lengths[i],
                             ignore_eos=not constrained,
                             response_format=fmt if constrained else None)  # type: ignore[arg-type]
              for i in range(BATCH)]
    start = time.perf_counter()
    outputs = llm.generate([PROMPT] * BATCH, params)
    wall = time.perf_counter() - start
    return wall, [len(o.choices[0].token_ids) for o in outputs], [o.text for o in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)

    import torch

    from kvrelay_worker.engine import LLM

    torch.set_num_threads(2)
    model = args.model
    if args.tiny:
        model = str(make_tiny_model(Path(tempfile.gettempdir()) / "kvrelay-tiny-bench"))
    llm = LLM(model, device="cpu", dtype="float32", quantization="none", max_num_seqs=BATCH,
              num_kv_blocks=512)
    run(llm, [8] * BATCH, True)  # warm-up: builds the compiler, compiles the grammar
    run(llm, [8] * BATCH, False)
    rounds: dict[str, list[float]] = {"free": [], "constrained": []}
    for _ in range(args.repeats):
        wall, lengths, texts = run(llm, [args.max_tokens] * BATCH, True)
        for text in texts:
            json.loads(text)  # raises when the grammar let something invalid through
        rounds["constrained"].append(sum(lengths) / wall)
        wall, free_lengths, _ = run(llm, lengths, False)
        rounds["free"].append(sum(free_lengths) / wall)
    free = statistics.median(rounds["free"])
    constrained = statistics.median(rounds["constrained"])
    cost = 1.0 - constrained / free
    print(f"model: {'tiny random' if args.tiny else model}, batch {BATCH}, CPU")
    print(f"| run | output tok/s (median of {args.repeats}) |")
    print("|---|---:|")
    print(f"| unconstrained | {free:.1f} |")
    print(f"| JSON schema | {constrained:.1f} |")
    print(f"cost: {100 * cost:.1f}% of throughput")
    write_result(args.out, "structured", args, {
        "model": "tiny" if args.tiny else model, "batch": BATCH, "rounds": rounds,
        "free_tok_s": free, "constrained_tok_s": constrained, "cost": cost})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
