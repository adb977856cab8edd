"""Per-step cost of stop-string matching: Aho-Corasick against a compiled regex and the old scan.

Each method gets the same text in token-sized chunks and answers the detokenizer's two
questions after every chunk: did a stop string end in it, and how much of the tail could
still begin one (held back from the stream). Stop strings that share the text's common
prefix (" the the ...") keep the tail "possible" for long stretches, the costly case.

    python benchmarks/stop_matching.py
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Callable

from harness import write_result

from kvrelay_worker.engine.sample.stop_matcher import ROOT, StopMatcher

Step = Callable[[str], tuple[bool, int]]


def old_scan(stops: list[str]) -> Step:
    """The previous detokenizer: ``find`` per stop string over a window, then a hold-back
    loop over every tail length and every stop string."""
    longest = max(len(s) for s in stops)
    text = ""

    def step(chunk: str) -> tuple[bool, int]:
        nonlocal text
        start = max(0, len(text) - longest + 1)
        text += chunk
        hit = any(text.find(s, start) >= 0 for s in stops)
        for length in range(min(longest - 1, len(text)), 0, -1):
            if any(s.startswith(text[-length:]) for s in stops):
                return hit, length
        return hit, 0

    return step


def regex_scan(stops: list[str]) -> Step:
    """One compiled alternation searched over the tail + the new text; hold-back from a set
    of every proper prefix, longest tail first."""
    longest = max(len(s) for s in stops)
    pattern = re.compile("|".join(re.escape(s) for s in sorted(stops, key=len, reverse=True)))
    prefixes = {s[:i] for s in stops for i in range(1, min(len(s), longest - 1) + 1)}
    text = ""

    def step(chunk: str) -> tuple[bool, int]:
        nonlocal text
        start = max(0, len(text) - longest + 1)
        text += chunk
        hit = pattern.search(text, start) is not None
        for length in range(min(longest - 1, len(text)), 0, -1):
            if text[-length:] in prefixes:
                return hit, length
        return hit, 0

    return step


def automaton_scan(stops: list[str]) -> Step:
    """What the detokenizer does now (``StopMatcher``)."""
    matcher = StopMatcher(stops)
    state = ROOT

    def step(chunk: str) -> tuple[bool, int]:
        nonlocal state
        result = matcher.scan(state, chunk)
        state = result.state
        return result.match_start is not None, matcher.pending(state)

    return step


def chunks(rng: random.Random, count: int) -> list[str]:
    words = [" the", " then", " these", " a", " of", " and", " thermal"]
    return ["".join(rng.choice(words) for _ in range(rng.randint(1, 2))) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/results/stop_matching.json")
    args = parser.parse_args()
    rng = random.Random(0)
    stops = [(" the" * args.length)[: args.length - 1] + chr(0x4E00 + i)
             for i in range(args.stops)]
    text = chunks(rng, args.tokens)
    print(f"{args.stops} stop strings x {args.length} chars, {args.tokens} chunks")
    print(f"{'method':<16} {'build ms':>9} {'us/step':>9}")
    answers = {}
    timings: dict[str, dict[str, float]] = {}
    for name, make in (("old scan", old_scan), ("regex", regex_scan),
                       ("aho-corasick", automaton_scan)):
        built = time.perf_counter()
        step = make(stops)
        start = time.perf_counter()
        answers[name] = [step(chunk) for chunk in text]
        end = time.perf_counter()
        timings[name] = {"build_ms": 1000 * (start - built),
                         "us_per_step": 1e6 * (end - start) / len(text)}
        print(f"{name:<16} {1000 * (start - built):>9.2f} "
              f"{1e6 * (end - start) / len(text):>9.1f}")
    if len({tuple(a) for a in answers.values()}) != 1:
        sys.exit("the methods disagree")
    write_result(args.out, "stop_matching", args, {"methods": timings})


if __name__ == "__main__":
    main()
