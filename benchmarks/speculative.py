"""Speculative decoding on CPU: each workload with speculation off and on, in one run.

SmolLM2 float32, greedy (so the outputs must be token-identical, and are checked), chat
template on. Rows:

- ``grounded-b1``: batch 1, prompts whose answer reuses the prompt's text (summarise a
  passage, fix a bug in a code listing, answer quoting a document; written below), with
  n-gram speculation. Goal: >= 2.0x output tokens/s.
- ``chat-b1``: batch 1, open-ended chat, n-gram. Goal: no worse than 0.97x.
- ``mixed-32``: 32 requests at once (grounded and open-ended), n-gram, the per-step policy
  deciding. Goal: >= 0.97x throughput.
- ``draft-b1``: the grounded prompts with a draft model (``--draft``: default a tiny random
  model with SmolLM2's vocabulary: an honest pairing for correctness, not for speed; the
  acceptance length and speed-up are reported as measured).
- ``queue-b1`` (``--queue``): the grounded prompts through Redis and a real ``kvrelay
  worker`` process, ``KVRELAY_SPECULATIVE=ngram`` against ``off``, streamed one at a time.

Output tokens/s = output tokens / wall time of the generation (model load and one
warm-up request are not timed). Writes JSON (``--out``).

    python benchmarks/speculative.py                 # in-process rows (several minutes)
    python benchmarks/speculative.py --queue         # plus the queue row
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import worker_stack, write_result
from harness.repository import load_repository_module

MODEL = "smollm2-135m-instruct"

PASSAGE = (
    "The lighthouse on Carrow Point was built in 1871 after three ships were lost on the "
    "reef in a single winter. Its first keeper, Marian Holt, kept a log of every vessel "
    "that passed, noting the weather, the direction of the wind and the time each ship "
    "cleared the reef. In 1923 the lamp was converted from oil to electricity, and in "
    "1961 the keeper's cottage was abandoned when the light became automatic. Today the "
    "tower is a museum, and Holt's logs, all forty-two volumes of them, are kept in the "
    "town library, where historians use them to study how shipping routes changed over "
    "ninety years."
)

CODE = '''def average_word_length(text):
    """Return the mean length of the words in text, or 0.0 for no words."""
    words = text.split()
    total = 0
    for word in words:
        total += len(word)
    return total / len(words)


def longest_word(text):
    """Return the longest word in text (the first one on ties)."""
    best = ""
    for word in text.split():
        if len(word) > len(best):
            best = word
    return best
'''

DOCUMENT = (
    "Returns policy. Items bought in our stores or online can be returned within 30 days "
    "of delivery for a full refund, provided they are unused and in their original "
    "packaging. Sale items can be returned within 14 days and are refunded as store "
    "credit. Electronics must be returned with all accessories and are inspected before "
    "a refund is issued. Refunds are made to the original payment method within 5 "
    "working days of our receiving the item. Return shipping is free for orders over 50 "
    "euros; otherwise a fee of 4.95 euros is deducted from the refund."
)

GROUNDED = [
    f"Summarise this passage in a few sentences, reusing its wording:\n\n{PASSAGE}",
    "The first function below crashes on an empty string. Fix the bug and show the whole "
    f"corrected file, both functions, in a code block.\n\n```python\n{CODE}```",
    f"Here is a document:\n\n{DOCUMENT}\n\nQuoting the document word for word, what does "
    "it say about sale items, electronics and return shipping?",
]

CHAT = [
    "Write a short story about a fox who learns to play the violin.",
    "What are three good habits for staying healthy while working from home?",
    "Explain why the sky is blue to a ten-year-old.",
]


def chat_prompt(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def make_llm(speculative: str, **extra: Any) -> Any:
    from kvrelay_worker.engine import LLM

    return LLM(MODEL, device="cpu", dtype="float32", quantization="none",
               speculative=speculative, **extra)


def timed_chat(llm: Any, prompts: list[str], max_tokens: int, batch: bool
               ) -> tuple[float, list[list[int]]]:
    """Seconds for the prompts (all at once when ``batch``, else one by one), outputs."""
    from kvrelay_worker import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    llm.chat(chat_prompt("Say hello."), SamplingParams(max_tokens=8, temperature=0.0))
    started = time.perf_counter()
    if batch:
        outs = llm.chat([chat_prompt(p) for p in prompts], params)
    else:
        outs = [llm.chat(chat_prompt(p), params)[0] for p in prompts]
    return time.perf_counter() - started, [list(o.token_ids) for o in outs]


def compare(name: str, llm_off: Any, llm_on: Any, prompts: list[str], max_tokens: int,
            batch: bool, goal: float | None) -> dict[str, Any]:
    before = dict(llm_on.engine.stats())
    off_s, off_out = timed_chat(llm_off, prompts, max_tokens, batch)
    on_s, on_out = timed_chat(llm_on, prompts, max_tokens, batch)
    after = llm_on.engine.stats()
    tokens = sum(len(o) for o in off_out)
    proposed = after["spec_proposed_tokens"] - before.get("spec_proposed_tokens", 0)
    accepted = after["spec_accepted_tokens"] - before.get("spec_accepted_tokens", 0)
    verifies = after["spec_verify_steps"] - before.get("spec_verify_steps", 0)
    row = {
        "row": name, "prompts": len(prompts), "output_tokens": tokens,
        "off_tok_s": tokens / off_s, "on_tok_s": sum(len(o) for o in on_out) / on_s,
        "identical": off_out == on_out, "proposed": proposed, "accepted": accepted,
        "verifications": verifies,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "mean_accepted_length": (accepted + verifies) / verifies if verifies else 0.0,
        "goal": goal,
    }
    row["speedup"] = row["on_tok_s"] / row["off_tok_s"]
    print_row(row)
    return row


def print_row(r: dict[str, Any]) -> None:
    goal = f">= {r['goal']:.2f}x" if r.get("goal") else "reported"
    print(f"{r['row']:<12} off {r['off_tok_s']:7.1f} tok/s  on {r['on_tok_s']:7.1f} tok/s  "
          f"x{r['speedup']:.2f} ({goal})  identical={r['identical']}  "
          f"accepted {r['accepted']}/{r['proposed']} drafts, "
          f"{r['mean_accepted_length']:.2f} tokens per verification", flush=True)


# -------------------------------------------------------------------------- queue row


async def _stream_one_by_one(url: str, served: str, prompts: list[str], max_tokens: int
                             ) -> tuple[float, list[list[int]]]:
    from kvrelay import AsyncClient

    outputs: list[list[int]] = []
    async with AsyncClient(url, model=served) as client:
        await client.generate(messages=chat_prompt("Say hello."), max_tokens=8,
                              temperature=0.0)
        started = time.perf_counter()
        for text in prompts:
            result = await client.generate(messages=chat_prompt(text),
                                           max_tokens=max_tokens, temperature=0.0)
            outputs.append(list(result.token_ids))
        return time.perf_counter() - started, outputs


def queue_run(speculative: str, prompts: list[str], max_tokens: int
              ) -> tuple[float, list[list[int]]]:
    settings = {"model": MODEL, "device": "cpu", "dtype": "float32",
                "speculative": speculative}
    with tempfile.TemporaryDirectory(prefix="kvrelay-spec-") as workdir, \
            worker_stack(settings, Path(workdir)) as stack:
        return asyncio.run(_stream_one_by_one(stack.url, stack.served_model, prompts,
                                              max_tokens))


def queue_row(prompts: list[str], max_tokens: int) -> dict[str, Any]:
    off_s, off_out = queue_run("off", prompts, max_tokens)
    on_s, on_out = queue_run("ngram", prompts, max_tokens)
    tokens = sum(len(o) for o in off_out)
    row = {"row": "queue-b1", "prompts": len(prompts), "output_tokens": tokens,
           "off_tok_s": tokens / off_s, "on_tok_s": sum(len(o) for o in on_out) / on_s,
           "identical": off_out == on_out, "proposed": 0, "accepted": 0,
           "verifications": 0, "acceptance_rate": 0.0, "mean_accepted_length": 0.0,
           "goal": 2.0}
    row["speedup"] = row["on_tok_s"] / row["off_tok_s"]
    print_row(row)
    return row


# ------------------------------------------------------------------------------ main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--draft", default=None,
                        help="draft model for the draft row (default: a tiny random model "
                        "with SmolLM2's vocabulary, built in a temporary folder)")
    parser.add_argument("--queue", action="store_true", help="add the queue row")
    parser.add_argument("--rows", nargs="*", default=None,
                        help="only these rows (grounded-b1 chat-b1 mixed-32 draft-b1)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "speculative.json")
    return parser.parse_args(argv)


def tiny_draft_folder(root: Path) -> str:
    from kvrelay_worker.loading import prepare_model

    build_tiny_model = load_repository_module("tests/helpers/tiny_models.py").build_tiny_model

    return str(build_tiny_model("llama-mqa", root / "tiny-draft",
                                tokenizer_folder=prepare_model(MODEL, progress=False)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = set(args.rows or ["grounded-b1", "chat-b1", "mixed-32", "draft-b1"])
    rows: list[dict[str, Any]] = []
    off = make_llm("off")
    ngram = make_llm("ngram")
    n = args.max_tokens
    if "grounded-b1" in wanted:
        rows.append(compare("grounded-b1", off, ngram, GROUNDED, n, False, 2.0))
    if "chat-b1" in wanted:
        rows.append(compare("chat-b1", off, ngram, CHAT, n, False, 0.97))
    if "mixed-32" in wanted:
        mixed = [(GROUNDED + CHAT)[i % 6] for i in range(32)]
        rows.append(compare("mixed-32", off, ngram, mixed, n // 2, True, 0.97))
    del ngram
    if "draft-b1" in wanted:
        with tempfile.TemporaryDirectory(prefix="kvrelay-draft-") as tmp:
            draft = args.draft or tiny_draft_folder(Path(tmp))
            with_draft = make_llm(f"draft:{draft}")
            row = compare("draft-b1", off, with_draft, GROUNDED, n, False, None)
            row["draft"] = args.draft or "tiny random llama-mqa (SmolLM2 vocabulary)"
            rows.append(row)
    if args.queue:
        rows.append(queue_row(GROUNDED, n))
    write_result(args.out, "speculative", args, {"rows": rows})
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
