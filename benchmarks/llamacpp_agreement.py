"""Teacher-forced agreement with float32: kvrelay's kept Q4_1 beside llama.cpp's, same text.

Both systems score the same English text of ``../shared/seeds`` by llama.cpp's perplexity
method (chunks of ``--ctx`` tokens, the first token of each the BOS, the second half of
each chunk predicted and scored) and compare each scored position's distribution with
float32's on the same file:

- llama.cpp: ``llama-perplexity --kl-divergence-base`` saves the F32 GGUF's logits
  (``SmolLM2-135M-Instruct.Q4_1.gguf`` dequantised to float32 and converted by llama.cpp's
  own ``convert_hf_to_gguf.py``), then ``llama-perplexity --kl-divergence`` runs the Q4_1
  file against them: its printed mean KL divergence, "Same top p" and both perplexities.
- kvrelay, in process: the same Q4_1 file kept quantized (``quantization="gguf"``, what a
  worker serves) against the same file dequantised (``quantization="none"``), and the kept
  file again with every product through the integer dot-product kernel (int16 activation
  blocks, what decode runs; prompts otherwise take the dequantizing kernels, exact to
  float32): mean KL(float32 || row), top-1 agreement and perplexity over the same
  positions.

llama.cpp quantizes every activation to 8-bit blocks (Q8_1) for its Q4_1 products, kvrelay
to 16-bit blocks, so the two rows say what each system's own arithmetic costs against the
same float32 model. Tokenizers differ (llama.cpp's own against Hugging Face's), so each
row states its scored token count.

    .venv/bin/python benchmarks/llamacpp_agreement.py [--ctx 256] [--chunks 8]
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import torch
from harness import write_result
from harness.llamacpp import add_bos, cache_root, convert, llamacpp_bin, work_file
from harness.seeds_text import english_text

from kvrelay_kernels import cpu_quantized_matmul

MODEL = "smollm2-135m-instruct"
SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
OUT = Path(__file__).parent / "measured" / "cpu-llamacpp-agreement.json"


def llamacpp_rows(tools: Path, f32: Path, q4: Path, text: Path,
                  args: argparse.Namespace) -> dict[str, Any]:
    """llama-perplexity's KL divergence of the Q4_1 file against the F32 file's logits."""
    base = cache_root() / "work" / f"agreement-{args.ctx}-{args.chunks}.kld"
    common = ["-f", str(text), "-c", str(args.ctx), "-b", str(args.ctx), "--chunks",
              str(args.chunks), "-t", str(args.threads), "--kl-divergence-base", str(base)]
    saved = subprocess.run([str(tools / "llama-perplexity"), "-m", str(f32), *common],
                           capture_output=True, text=True)
    if saved.returncode != 0:
        return {"error": f"base: exit {saved.returncode}: {saved.stderr[-400:]}"}
    run = subprocess.run([str(tools / "llama-perplexity"), "-m", str(q4), *common,
                          "--kl-divergence"], capture_output=True, text=True)
    out = run.stdout + run.stderr
    patterns = {"mean_kld": r"Mean\s+KLD:\s+(-?[0-9.]+)",
                "same_top_p_percent": r"Same top p:\s+([0-9.]+)",
                "ppl_q4_1": r"Mean PPL\(Q\)\s*:\s*([0-9.]+)",
                "ppl_f32": r"Mean PPL\(base\)\s*:\s*([0-9.]+)"}
    found = {k: re.search(p, out) for k, p in patterns.items()}
    if run.returncode != 0 or any(v is None for v in found.values()):
        return {"error": f"exit {run.returncode}: {out[-600:]}"}
    row: dict[str, Any] = {k: float(v.group(1)) for k, v in found.items() if v is not None}
    row["top1_agreement"] = row.pop("same_top_p_percent") / 100
    chunks = re.search(r"over (\d+) chunks", out)
    row["chunks"] = int(chunks.group(1)) if chunks else None
    row["scored_tokens"] = (row["chunks"] or 0) * (args.ctx - 1 - args.ctx // 2)
    return row


def chunk_logprobs(llm: Any, tokens: list[int], ctx: int, chunks: int,
                   bos: int | None) -> list[tuple[torch.Tensor, list[int]]]:
    """Per chunk: log-probabilities at the scored positions, and the tokens they predict."""
    from kvrelay_worker.teacher_forcing import sequence_logits

    out = []
    for i in range(chunks):
        chunk = tokens[i * ctx:(i + 1) * ctx]
        if bos is not None:
            chunk = [bos, *chunk[1:]]
        logits = sequence_logits(llm.engine, chunk).double()[ctx // 2:ctx - 1]
        out.append((torch.log_softmax(logits, dim=-1), chunk[ctx // 2 + 1:ctx]))
    return out


def compare(row: list[tuple[torch.Tensor, list[int]]],
            base: list[tuple[torch.Tensor, list[int]]]) -> dict[str, Any]:
    kld, agree, nll, nll_base, count = 0.0, 0, 0.0, 0.0, 0
    for (lp, targets), (lp_base, _) in zip(row, base, strict=True):
        kld += (lp_base.exp() * (lp_base - lp)).sum().item()
        agree += int((lp.argmax(-1) == lp_base.argmax(-1)).sum())
        index = torch.tensor(targets)[:, None]
        nll -= lp.gather(1, index).sum().item()
        nll_base -= lp_base.gather(1, index).sum().item()
        count += len(targets)
    return {"mean_kld": kld / count, "top1_agreement": agree / count,
            "ppl_q4_1": math.exp(nll / count), "ppl_f32": math.exp(nll_base / count),
            "scored_tokens": count}


def kvrelay_rows(q4: Path, text: Path, args: argparse.Namespace) -> dict[str, Any]:
    from kvrelay_worker.engine.llm import LLM

    def load(quantization: str) -> Any:
        return LLM(str(q4), device="cpu", dtype="float32", quantization=quantization,
                   max_num_seqs=2, enable_prefix_caching=False)

    reference = load("none")
    tokens = reference.tokenizer.encode(text.read_text(encoding="utf-8"))
    bos = reference.tokenizer.bos_token_id if add_bos(q4) else None
    if len(tokens) < args.ctx * args.chunks:
        raise SystemExit(f"the text holds {len(tokens)} tokens, fewer than ctx x chunks")
    base = chunk_logprobs(reference, tokens, args.ctx, args.chunks, bos)
    del reference
    kept = load("gguf")
    rows = {"kvrelay Q4_1 kept": compare(chunk_logprobs(kept, tokens, args.ctx, args.chunks,
                                                        bos), base)}
    saved = dict(cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS)
    cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS = {8: 1 << 30, 4: 1 << 30}
    try:
        rows["kvrelay Q4_1 kept, int16 dot every row"] = compare(
            chunk_logprobs(kept, tokens, args.ctx, args.chunks, bos), base)
    finally:
        cpu_quantized_matmul.INTEGER_DOT_MAX_ROWS = saved
    for row in rows.values():
        row["text_tokens"] = len(tokens)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", default="native", help="llama.cpp build (harness)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvrelay_worker.loading import prepare_model
    from kvrelay_worker.loading.registry import registry_model_path

    tools = llamacpp_bin(args.variant, ("llama-perplexity",))
    work = cache_root() / "kquant-files"
    work.mkdir(parents=True, exist_ok=True)
    q4 = registry_model_path(MODEL)
    f32 = convert(prepare_model(MODEL, progress=False), work / "smollm2-135m-F32.gguf")
    text = work_file("seeds-english.txt", english_text(SEEDS))
    rows = {"llama.cpp Q4_1": llamacpp_rows(tools, f32, q4, text, args),
            **kvrelay_rows(q4, text, args)}
    print(f"{'row':<40} {'mean KLD':>10} {'top-1 agree':>12} {'ppl':>8} {'ppl f32':>8}")
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<40} {row['error']}")
            continue
        print(f"{name:<40} {row['mean_kld']:>10.2e} {row['top1_agreement']:>12.2%} "
              f"{row['ppl_q4_1']:>8.3f} {row['ppl_f32']:>8.3f}")
    write_result(args.out, "llamacpp_agreement", args, {
        "model": MODEL, "ctx": args.ctx, "chunks": args.chunks,
        "rows": [{"row": name, **row} for name, row in rows.items()]})


if __name__ == "__main__":
    main()
