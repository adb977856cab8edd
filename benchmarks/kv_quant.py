"""Quality and capacity of the quantized KV cache: perplexity and block counts.

Perplexity of a model (SmolLM2-135M-Instruct by default) over the English text of the
seeds folder, in fixed windows of ``--window`` tokens (each window's first token is not
scored), with the KV cache in the model's dtype (``auto``), ``int8`` and ``fp8_e4m3``.
Each window is one prefill through the engine's model runner: its keys and values are
stored into the cache and read back from it (quantized when asked) by paged attention,
exactly as in serving. Also reported: teacher-forced top-1 agreement with ``auto`` (the
same token sequence, next-token argmax per position) and the KV block count each
configuration gets from one ``--kv-cache-memory``.

    python benchmarks/kv_quant.py                 # prints the table, writes JSON
    python benchmarks/kv_quant.py --quick         # two windows (smoke test)
    python benchmarks/kv_quant.py --decode-batch 8  # also decode tokens/s per cache dtype
      (512-token prompts; rounds after the first hit the prefix cache, so they time
      mostly decoding, which is where the cache dtype matters)

``window_logits`` / ``kv_cache_perplexity`` are the functions a quality benchmark can call.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from harness import write_result

DEFAULT_MODEL = "smollm2-135m-instruct"
KV_DTYPES = ("auto", "int8", "fp8_e4m3")
GOAL_PPL_DELTA = 0.005  # int8 KV: perplexity at most +0.5% over the float cache
GOAL_BLOCK_RATIO = 3.9  # int8 KV: at least 3.9x the float32 block count


def default_seeds() -> Path:
    """``../shared/seeds`` of the checkout, or of a folder above it (worktrees nest)."""
    root = Path(__file__).resolve().parents[1]
    for folder in root.parents:
        if (folder / "shared" / "seeds").is_dir():
            return folder / "shared" / "seeds"
    return root.parent / "shared" / "seeds"




def english_text(folder: Path) -> str:
    """The seeds' English: every line of the folder's ``*.txt`` files that is ASCII (the
    seeds mix in translated Chinese lines; those are left out), in file-name order."""
    lines = []
    for path in sorted(folder.glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and line.isascii():
                lines.append(line)
    return "\n".join(lines)


@dataclass
class QualityResult:
    kv_cache_dtype: str
    tokens_scored: int
    windows: int
    nll: float
    perplexity: float
    top1_agreement: float | None  # with the first configuration, teacher-forced
    total_blocks: int
    seconds: float
    decode_tokens_per_s: float | None = None  # with --decode-batch: median of the rounds


def decode_tokens_per_s(engine: Any, token_ids: Sequence[int], batch: int,
                        new_tokens: int, prompt_len: int = 512) -> float:
    """Output tokens/s of ``batch`` greedy requests (prompts: ``prompt_len``-token slices of
    the text) each generating ``new_tokens``; the prompts' prefill is included."""
    from kvrelay_worker.engine import LLM, SamplingParams

    prompts = [list(token_ids[i * prompt_len % len(token_ids):][:prompt_len])
               for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    llm = LLM.from_engine(engine)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    began = time.perf_counter()
    llm.generate(prompts, params)
    return batch * new_tokens / (time.perf_counter() - began)


def window_logits(engine: Any, window: Sequence[int]) -> torch.Tensor:
    """Logits ``[len(window), vocab]`` (float32) of one prefill of ``window`` through the
    engine's runner: K/V stored into and read from its cache (blocks 0, 1, ...), as the
    engine would for a prompt; the engine must be idle."""
    from kvrelay_worker.engine.sampling_params import SamplingParams
    from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence
    from kvrelay_worker.engine.sched.sequence import Sequence as EngineSequence

    runner = engine.runner
    num_blocks = -(-len(window) // runner.block_size)
    if num_blocks > runner.num_blocks:
        raise ValueError(f"a window of {len(window)} tokens needs {num_blocks} KV blocks, "
                         f"the engine has {runner.num_blocks}")
    seq = EngineSequence(request_id="kv-quant-window", choice_index=0, token_ids=list(window),
                         num_prompt_tokens=len(window), params=SamplingParams(max_tokens=1))
    seq.block_table = array("i", range(num_blocks))
    with torch.inference_mode():
        inputs = runner.to_device(runner.prepare_host([ScheduledSequence(seq, len(window))]))
        hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta)
        return runner.model.compute_logits(hidden).float()


def kv_cache_perplexity(engine: Any, token_ids: Sequence[int], window: int,
                        reference_argmax: list[torch.Tensor] | None = None
                        ) -> tuple[float, int, list[torch.Tensor]]:
    """``(mean NLL, tokens scored, per-window argmax)`` over fixed windows of ``token_ids``.

    ``reference_argmax`` (another run's third result) is only passed through for the
    caller's agreement count; windows shorter than 2 tokens are dropped.
    """
    total, count = 0.0, 0
    argmaxes = []
    for start in range(0, len(token_ids) - 1, window):
        chunk = list(token_ids[start : start + window])
        if len(chunk) < 2:
            break
        logits = window_logits(engine, chunk)
        targets = torch.tensor(chunk[1:], device=logits.device)
        nll = torch.nn.functional.cross_entropy(logits[:-1], targets, reduction="sum")
        total += float(nll)
        count += len(chunk) - 1
        argmaxes.append(logits[:-1].argmax(-1).cpu())
    return total / count, count, argmaxes


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine

    torch.set_num_threads(args.threads)
    text = english_text(args.seeds)
    base = LLM(args.model, device=args.device, kv_cache_memory=args.kv_cache_memory,
               quantization="none")  # the engines below take its float weights
    token_ids = base.tokenizer.encode(text)
    if args.quick:
        token_ids = token_ids[: 2 * args.window]
    results: list[QualityResult] = []
    reference: list[torch.Tensor] | None = None
    engines = {}
    for kv_dtype in args.kv_cache_dtypes:
        config = EngineConfig(model=args.model, device=args.device,
                              kv_cache_memory=args.kv_cache_memory, kv_cache_dtype=kv_dtype)
        engine = LLMEngine.from_model(config, base.engine.model, base.tokenizer,
                                      model_id=base.engine.model_id)
        engines[kv_dtype] = engine
        began = time.perf_counter()
        nll, scored, argmaxes = kv_cache_perplexity(engine, token_ids, args.window)
        seconds = time.perf_counter() - began
        agreement = None
        if reference is None:
            reference = argmaxes
        else:
            same = sum(int((a == b).sum()) for a, b in zip(argmaxes, reference, strict=True))
            agreement = same / scored
        results.append(QualityResult(
            kv_cache_dtype=kv_dtype, tokens_scored=scored, windows=len(argmaxes), nll=nll,
            perplexity=math.exp(nll), top1_agreement=agreement,
            total_blocks=engine.stats()["total_blocks"], seconds=seconds))
    if args.decode_batch:  # rounds alternate between the configurations: drift hits all
        speeds: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(args.decode_rounds):
            for kv_dtype, engine in engines.items():
                speeds[kv_dtype].append(decode_tokens_per_s(
                    engine, token_ids, args.decode_batch, args.decode_tokens))
        for result in results:
            result.decode_tokens_per_s = statistics.median(speeds[result.kv_cache_dtype])
    return {"model": args.model, "device": args.device, "window": args.window,
            "kv_cache_memory": args.kv_cache_memory, "threads": args.threads,
            "decode_batch": args.decode_batch, "decode_tokens": args.decode_tokens,
            "decode_rounds": args.decode_rounds,
            "text_chars": len(text), "tokens": len(token_ids), "quick": args.quick,
            "torch": torch.__version__,
            "results": [asdict(r) for r in results]}


def print_table(report: dict[str, Any]) -> None:
    rows = report["results"]
    base = rows[0]
    print(f"{report['model']} on {report['device']}: {base['tokens_scored']} tokens scored in "
          f"{base['windows']} windows of {report['window']} (English text of the seeds, "
          f"{report['text_chars']} characters); KV memory {report['kv_cache_memory']} bytes")
    print(f"{'kv_cache_dtype':<16}{'perplexity':>12}{'vs first':>10}{'top-1 agree':>13}"
          f"{'blocks':>9}{'x blocks':>10}{'seconds':>9}{'decode tok/s':>14}")
    for row in rows:
        delta = row["perplexity"] / base["perplexity"] - 1
        agree = "" if row["top1_agreement"] is None else f"{row['top1_agreement']:.4f}"
        print(f"{row['kv_cache_dtype']:<16}{row['perplexity']:>12.4f}{delta:>+10.3%}"
              f"{agree:>13}{row['total_blocks']:>9}"
              f"{row['total_blocks'] / base['total_blocks']:>10.2f}{row['seconds']:>9.1f}"
              f"{row['decode_tokens_per_s'] or 0:>14.1f}")
    int8 = next((r for r in rows if r["kv_cache_dtype"] == "int8"), None)
    if int8 is not None and base["kv_cache_dtype"] == "auto":
        delta = int8["perplexity"] / base["perplexity"] - 1
        ratio = int8["total_blocks"] / base["total_blocks"]
        print(f"int8 KV: perplexity {delta:+.3%} (goal <= +{GOAL_PPL_DELTA:.1%}: "
              f"{'met' if delta <= GOAL_PPL_DELTA else 'NOT met'}); blocks {ratio:.2f}x "
              f"(goal >= {GOAL_BLOCK_RATIO}x: {'met' if ratio >= GOAL_BLOCK_RATIO else 'NOT met'})")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=Path, default=default_seeds())
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--kv-cache-memory", type=int, default=256 << 20)
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=list(KV_DTYPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-batch", type=int, default=0,
                        help="also time greedy decoding of this many requests (0: off)")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--decode-rounds", type=int, default=3,
                        help="rounds of decode timing, alternating configurations (median)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "measured" / "cpu-kv-quant.json")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print_table(report)
    if not args.quick:
        write_result(args.out, "kv_quant", args, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
