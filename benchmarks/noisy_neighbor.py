"""One maximal-but-valid request batched with 31 ordinary ones: what does it cost them?

Every per-request input a caller controls (stop strings, logit_bias, stop_token_ids,
min_tokens) is paid for inside the engine step that all requests in the batch share. This
runs the real ``LLMEngine`` twice per round on the same 32 prompts: once with 32 ordinary
requests, once with the 32nd replaced by a request that uses every such input at its cap;
the 31 others are measured in both. Rounds alternate, so machine drift hits both alike.

Reported: the inter-token latency (ITL) of the 31 ordinary requests with and without the
maximal neighbour, and the ratio (goal: at most 1.10).

    python benchmarks/noisy_neighbor.py              # tiny random model (default)
    python benchmarks/noisy_neighbor.py --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import percentiles, write_result
from harness.tiny_model import make_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"
NUM_REQUESTS = 32

# Caps used when the protocol module does not define them (yet): (protocol names, value).
FALLBACK_CAPS: dict[str, tuple[tuple[str, ...], int]] = {
    "stop_strings": (("MAX_STOP_STRINGS",), 16),
    "stop_string_chars": (("MAX_STOP_STRING_CHARS",), 256),
    "stop_token_ids": (("MAX_STOP_TOKEN_IDS",), 256),
    "logit_bias": (("MAX_LOGIT_BIAS_ENTRIES",), 300),
}


def request_caps() -> tuple[dict[str, int], dict[str, str]]:
    """The caps on per-request inputs: from ``kvrelay.protocol`` where it defines them."""
    import kvrelay.protocol as protocol

    caps: dict[str, int] = {}
    sources: dict[str, str] = {}
    for key, (names, fallback) in FALLBACK_CAPS.items():
        found = next((n for n in names if isinstance(getattr(protocol, n, None), int)), None)
        caps[key] = int(getattr(protocol, found)) if found else fallback
        sources[key] = f"kvrelay.protocol.{found}" if found else "this benchmark's choice"
    return caps, sources


def maximal_params(caps: dict[str, int], tokenizer: Any, vocab_size: int, max_tokens: int,
                   rng: random.Random) -> Any:
    """Every per-request input at its cap, greedy like the others so only the caps differ.

    The costly case for stop matching: the largest bias pins the output to " the the ...",
    and every stop string runs along that text for half its length before it diverges, so
    long tails of the text keep "possibly" beginning one. ``min_tokens = max_tokens`` keeps
    the stop-token mask on for the whole run.
    """
    from kvrelay_worker.engine import SamplingParams

    length = caps["stop_string_chars"]
    the = " the" * length
    stops = [the[: length // 2] + chr(0x4E00 + i) + the[: length - length // 2 - 1]
             for i in range(caps["stop_strings"])]
    [the_token] = tokenizer.encode(" the")
    others = [t for t in range(3, vocab_size) if t != the_token]
    bias = {t: rng.uniform(-5.0, 5.0) for t in rng.sample(others, caps["logit_bias"] - 1)}
    bias[the_token] = 100.0
    stop_ids = rng.sample(others, caps["stop_token_ids"])
    return SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                          stop=stops, stop_token_ids=stop_ids, logit_bias=bias)


def ordinary_params(max_tokens: int) -> Any:
    """Greedy, no extras: the cheapest step, so whatever the neighbour adds shows."""
    from kvrelay_worker.engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@dataclass
class Round:
    """One run of the 32 requests: the ordinary ones' ITLs, and what the engine spent."""

    itls: list[float]
    neighbour_text: str
    wall_s: float
    cpu_s: float
    steps: int


def run_round(engine: Any, prompts: list[list[int]], neighbour: Any, max_tokens: int) -> Round:
    """Run the 32 requests to the end, timing the 31 ordinary ones' tokens."""
    ordinary = {f"r{i}" for i in range(NUM_REQUESTS - 1)}
    for i, prompt in enumerate(prompts[:-1]):
        engine.add_request(f"r{i}", prompt, ordinary_params(max_tokens))
    engine.add_request("neighbour", prompts[-1], neighbour)
    last: dict[str, float] = {}
    itls: list[float] = []
    neighbour_text = ""
    steps = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        steps += 1
        now = time.perf_counter()
        for out in outputs:
            if out.request_id not in ordinary:
                neighbour_text += "".join(d.text for d in out.deltas)
                continue
            produced = sum(len(d.token_ids) for d in out.deltas)
            if produced == 0:
                continue
            if out.request_id in last:
                itls.append((now - last[out.request_id]) / produced)
            last[out.request_id] = now
    return Round(itls, neighbour_text, time.perf_counter() - start, time.process_time() - cpu_start, steps)


def summary(itls: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in itls]
    points = percentiles(ms)
    return {"mean_ms": statistics.fmean(ms), "p50_ms": points["p50"], "p90_ms": points["p90"],
            "p99_ms": points["p99"], "count": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (2-layer random Llama, SmolLM2's tokenizer) or any model "
                             "kvrelay loads")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 keeps shared CPUs from spin-waiting)")
    parser.add_argument("--out", type=Path, default=RESULTS / "noisy_neighbor.json")
    args = parser.parse_args()

    import torch

    from kvrelay_worker.engine.config import EngineConfig
    from kvrelay_worker.engine.llm_engine import LLMEngine

    torch.set_num_threads(args.threads)

    model = (str(make_tiny_model(RESULTS / "tiny-model")) if args.model == "tiny"
             else args.model)
    engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32",
                                    max_num_seqs=NUM_REQUESTS, max_num_batched_tokens=2048,
                                    enable_prefix_caching=False, kv_cache_memory=256 << 20))
    rng = random.Random(0)
    vocab = engine.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)]
               for _ in range(NUM_REQUESTS)]
    caps, sources = request_caps()
    print("caps used:", ", ".join(f"{k}={v} ({sources[k]})" for k, v in caps.items()))
    neighbours = {"ordinary": ordinary_params(args.max_tokens),
                  "maximal": maximal_params(caps, engine.tokenizer, vocab, args.max_tokens, rng)}

    for name, params in neighbours.items():  # warm-up, not counted
        text = run_round(engine, prompts, params, args.max_tokens).neighbour_text
        print(f"{name} neighbour's text: {text[:60]!r}...")
    rounds: dict[str, list[Round]] = {name: [] for name in neighbours}
    for _ in range(args.rounds):  # alternating, so drift hits both alike
        for name, params in neighbours.items():
            rounds[name].append(run_round(engine, prompts, params, args.max_tokens))

    stats = {name: {**summary([x for r in runs for x in r.itls]),
                    "cpu_ms_per_step": 1000 * sum(r.cpu_s for r in runs) / sum(r.steps for r in runs),
                    "median_round_s": statistics.median(r.wall_s for r in runs)}
             for name, runs in rounds.items()}
    ratio = {key: stats["maximal"][key] / stats["ordinary"][key]
             for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "cpu_ms_per_step",
                         "median_round_s")}
    # Each maximal round against the ordinary round just before it: robust to slow drift.
    paired = statistics.median(
        statistics.fmean(m.itls) / statistics.fmean(o.itls)
        for o, m in zip(rounds["ordinary"], rounds["maximal"], strict=True))
    ratio["paired_mean_itl"] = paired
    print(f"\nmodel: {args.model}, {NUM_REQUESTS} requests x {args.max_tokens} tokens, "
          f"{args.rounds} rounds, torch threads {torch.get_num_threads()}")
    header = ("32nd request", "ITL mean", "p50", "p90", "p99", "CPU ms/step", "round s")
    print(f"{header[0]:<12} {header[1]:>9} {header[2]:>8} {header[3]:>8} {header[4]:>8} "
          f"{header[5]:>12} {header[6]:>8}")
    for name, s in [*stats.items(), ("ratio", ratio)]:
        print(f"{name:<12} {s['mean_ms']:>9.3f} {s['p50_ms']:>8.3f} {s['p90_ms']:>8.3f} "
              f"{s['p99_ms']:>8.3f} {s['cpu_ms_per_step']:>12.3f} {s['median_round_s']:>8.3f}")
    print(f"median of per-round mean-ITL ratios (maximal / ordinary): {paired:.3f}")
    write_result(args.out, "noisy_neighbor", args, {
        "model": args.model, "requests": NUM_REQUESTS, "max_tokens": args.max_tokens,
        "prompt_len": args.prompt_len, "rounds": args.rounds, "caps": caps,
        "cap_sources": sources, "torch_threads": torch.get_num_threads(),
        "itl": stats, "ratio_maximal_over_ordinary": ratio,
    })


if __name__ == "__main__":
    main()
