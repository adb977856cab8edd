"""Prefix-aware placement: multi-turn conversations on two real workers, placement on vs off.

Workload (same for both runs, seeded): ``--conversations`` conversations of ``--turns``
turns over ``--system-prompts`` long shared system prompts (conversation ``c`` uses
prompt ``c mod k``). A turn's prompt is the system prompt plus the conversation so far
(every earlier user message and the text the model answered) plus a new user message,
as plain text; each turn asks for ``--max-tokens`` tokens (greedy, EOS ignored). A
conversation sends its turns one after another; conversations run concurrently.

Each run starts a fresh private ``redis-server`` and two fresh worker processes (empty
prefix caches), then runs the workload through one ``AsyncClient`` with
``placement=True`` or ``placement=False``. Reported per run: prefix-cache hit rate
(cached prompt tokens / prompt tokens, from every job's usage), TTFT p50/p90 (client
side: from the call to the first token), total throughput (output tokens / wall time),
and each worker's share of the jobs; then the ratios on / off.

    python benchmarks/placement.py [--model smollm2-135m-instruct] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import private_redis, write_result

# A random-weight Llama with SmolLM2's tokenizer, 6 layers 384 wide (~11M parameters
# beside the embeddings, a tenth of SmolLM2's): prefill still dominates a long prompt's
# TTFT, yet two workers finish the workload in minutes on a shared 2-core machine, where
# SmolLM2 itself managed about one engine step every 15 s per worker.
DEFAULT_MODEL = "random-small"
_RANDOM_SMALL = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6,
                 "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64}
_WORDS = (
    "the", "river", "model", "cache", "token", "worker", "queue", "prompt", "system",
    "answer", "question", "light", "stone", "garden", "window", "paper", "signal",
    "engine", "market", "winter", "summer", "yellow", "green", "quiet", "rapid", "ancient",
    "modern", "simple", "careful", "honest", "travel", "harbor", "mountain", "forest",
    "library", "number", "letter", "music", "planet", "ocean", "bridge", "castle",
    "village", "teacher", "doctor", "farmer", "pilot", "artist", "writer", "reader",
    "player", "captain", "driver",
)


@dataclass
class Workload:
    system_prompts: list[str]
    # conversations[c][t]: the user message of turn t of conversation c.
    conversations: list[list[str]]
    max_tokens: int


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def random_small_model(folder: Path, seed: int = 0) -> Path:
    """Write (once) the ``random-small`` model into ``folder``."""
    from tiny_model import make_random_llama

    return make_random_llama(folder, {**_RANDOM_SMALL, "max_position_embeddings": 4096,
                                      "initializer_range": 0.05}, seed)


def make_workload(args: argparse.Namespace) -> Workload:
    rng = random.Random(args.seed)
    systems = [f"You are assistant number {k}. " + _text(rng, args.system_words)
               for k in range(args.system_prompts)]
    conversations = [[_text(rng, args.user_words) for _ in range(args.turns)]
                     for _ in range(args.conversations)]
    return Workload(systems, conversations, args.max_tokens)


@dataclass
class JobResult:
    conversation: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    worker_pid: int
    # The worker's timings: enqueue -> pickup, and enqueue -> first token.
    queue_s: float
    worker_ttft_s: float


@dataclass
class RunResult:
    placement: bool
    wall_s: float
    jobs: list[JobResult] = field(default_factory=list)

    def turn_populations(self) -> dict[str, Any]:
        """Later turns (not a conversation's first) split by whether they ran on the worker
        that ran the conversation's previous turn (its history cached there) or moved.

        In the off run, a turn that stayed is a cache hit that the shared queue made by
        chance, on whichever worker asked first; placement can at best give every later
        turn such a hit, so ``off TTFT p50 / stayed TTFT p50`` of the off run bounds the
        TTFT p50 gain that placement could show on this workload.
        """
        previous = {(j.conversation, j.turn): j.worker_pid for j in self.jobs}
        stayed: list[float] = []
        moved: list[float] = []
        for job in self.jobs:
            before = previous.get((job.conversation, job.turn - 1))
            if job.turn > 0 and before is not None:
                (stayed if before == job.worker_pid else moved).append(job.ttft_s)
        first = [j.ttft_s for j in self.jobs if j.turn == 0]
        return {
            "stayed_turns": len(stayed),
            "stayed_ttft_p50_s": statistics.median(stayed) if stayed else None,
            "moved_turns": len(moved),
            "moved_ttft_p50_s": statistics.median(moved) if moved else None,
            "first_turn_ttft_p50_s": statistics.median(first) if first else None,
        }

    def summary(self) -> dict[str, Any]:
        prompt = sum(j.prompt_tokens for j in self.jobs)
        cached = sum(j.cached_tokens for j in self.jobs)
        output = sum(j.output_tokens for j in self.jobs)
        ttfts = sorted(j.ttft_s for j in self.jobs)
        shares = Counter(j.worker_pid for j in self.jobs)
        return {
            "placement": self.placement,
            "jobs": len(self.jobs),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else 0.0,
            "ttft_p50_s": statistics.median(ttfts),
            "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
            "queue_p50_s": statistics.median(j.queue_s for j in self.jobs),
            "worker_ttft_p50_s": statistics.median(j.worker_ttft_s for j in self.jobs),
            "output_tokens": output,
            "wall_s": self.wall_s,
            "output_tok_per_s": output / self.wall_s,
            "jobs_per_s": len(self.jobs) / self.wall_s,
            "max_worker_share": max(shares.values()) / len(self.jobs),
            "worker_jobs": sorted(shares.values(), reverse=True),
            **self.turn_populations(),
        }


async def _conversation(client: Any, workload: Workload, c: int, results: list[JobResult]
                        ) -> None:
    history = workload.system_prompts[c % len(workload.system_prompts)]
    for turn, message in enumerate(workload.conversations[c]):
        prompt = f"{history}\nUser: {message}\nAssistant:"
        sent = time.perf_counter()
        first: float | None = None
        async with client.stream(prompt=prompt, max_tokens=workload.max_tokens,
                                 temperature=0.0, ignore_eos=True) as stream:
            async for chunk in stream:
                if first is None and chunk.token_ids:
                    first = time.perf_counter()
            completion = await stream.final()
        assert completion.worker is not None
        results.append(JobResult(
            conversation=c, turn=turn, prompt_tokens=completion.usage.prompt_tokens,
            cached_tokens=completion.usage.cached_tokens,
            output_tokens=completion.usage.completion_tokens,
            ttft_s=(first or time.perf_counter()) - sent,
            worker_pid=int(completion.worker.split(":")[1]),
            queue_s=completion.timings.queue, worker_ttft_s=completion.timings.ttft))
        history = f"{prompt}{completion.text}"


async def _drive(url: str, model: str, workload: Workload, placement: bool,
                 load_cap: float) -> RunResult:
    from kvrelay import AsyncClient

    async with AsyncClient(url, model=model, stream_timeout=1800, placement=placement,
                           placement_load_cap=load_cap) as client:
        results: list[JobResult] = []
        start = time.perf_counter()
        await asyncio.gather(*(_conversation(client, workload, c, results)
                               for c in range(len(workload.conversations))))
        return RunResult(placement, time.perf_counter() - start, results)


def run_once(model: str, workload: Workload, args: argparse.Namespace, placement: bool
             ) -> RunResult:
    """A fresh Redis and two fresh workers, the workload, then everything stopped."""
    from kvrelay import Client
    from kvrelay.cli import processes
    from kvrelay.cli.worker_launch import plan_worker, worker_environment

    with tempfile.TemporaryDirectory(prefix="kvrelay-placement-") as workdir, \
            private_redis(Path(workdir) / "redis") as redis:
        workers = []
        try:
            settings = {"model": model, "device": "cpu", "dtype": "float32",
                        "concurrency": args.concurrency, "kv_cache_memory": args.kv_cache_memory,
                        "max_num_seqs": args.concurrency, "redis_url": redis.url}
            cpus = sorted(os.sched_getaffinity(0))
            for n in range(2):
                plan = plan_worker(worker_environment(os.environ, settings), loglevel="WARNING",
                                   hostname=f"placement-{n}@%h")
                argv, env = list(plan.argv), dict(plan.env)
                if args.pin and len(cpus) >= 2:
                    # One core and one matmul thread per worker, as one worker per
                    # accelerator: two workers' thread pools never fight over both cores.
                    argv = ["taskset", "-c", str(cpus[n % len(cpus)]), *argv]
                    env["OMP_NUM_THREADS"] = "1"
                workers.append(processes.spawn(argv, env=env,
                                               log=Path(workdir) / f"worker{n}.log"))
            served = plan.served_model
            with Client(redis.url, model=served, require_worker=False) as client:
                deadline = time.monotonic() + 600
                while len(client.workers()) < 2:
                    if any(w.poll() is not None for w in workers):
                        raise RuntimeError("a worker exited: "
                                           + (Path(workdir) / "worker0.log").read_text()[-2000:])
                    if time.monotonic() > deadline:
                        raise TimeoutError("workers not ready")
                    time.sleep(0.2)
            return asyncio.run(_drive(redis.url, served, workload, placement, args.load_cap))
        finally:
            for worker in workers:
                processes.stop(worker, grace=40)


def print_table(off: dict[str, Any], on: dict[str, Any]) -> dict[str, float]:
    ratios = {
        "hit_rate_on_minus_off": on["hit_rate"] - off["hit_rate"],
        "ttft_p50_off_over_on": off["ttft_p50_s"] / on["ttft_p50_s"],
        "throughput_on_over_off": on["output_tok_per_s"] / off["output_tok_per_s"],
    }
    print(f"{'placement':<10} {'jobs':>5} {'hit rate':>9} {'TTFT p50 s':>11} "
          f"{'TTFT p90 s':>11} {'out tok/s':>10} {'wall s':>8} {'jobs per worker':>16}")
    for r in (off, on):
        print(f"{'on' if r['placement'] else 'off':<10} {r['jobs']:>5} {r['hit_rate']:>9.1%} "
              f"{r['ttft_p50_s']:>11.3f} {r['ttft_p90_s']:>11.3f} "
              f"{r['output_tok_per_s']:>10.2f} {r['wall_s']:>8.1f} "
              f"{'/'.join(map(str, r['worker_jobs'])):>16}")
    for r in (off, on):
        print(f"placement {'on' if r['placement'] else 'off'}: enqueue->pickup p50 "
              f"{r['queue_p50_s']:.3f} s, enqueue->first token p50 (worker) "
              f"{r['worker_ttft_p50_s']:.3f} s")
    for r in (off, on):
        stayed, moved = r["stayed_ttft_p50_s"], r["moved_ttft_p50_s"]
        print(f"placement {'on' if r['placement'] else 'off'}: later turns on the previous "
              f"turn's worker {r['stayed_turns']} (TTFT p50 "
              f"{'-' if stayed is None else f'{stayed:.3f} s'}), moved {r['moved_turns']} "
              f"(TTFT p50 {'-' if moved is None else f'{moved:.3f} s'}); first turns "
              f"{r['first_turn_ttft_p50_s']:.3f} s")
    if off["stayed_ttft_p50_s"]:
        ratios["ttft_p50_bound_off_over_stayed"] = off["ttft_p50_s"] / off["stayed_ttft_p50_s"]
        print(f"bound: were every later turn as fast as the off run's turns that stayed, "
              f"TTFT p50 off/on could reach {ratios['ttft_p50_bound_off_over_stayed']:.2f}x")
    print(f"TTFT p50 off/on: {ratios['ttft_p50_off_over_on']:.2f}x   throughput on/off: "
          f"{ratios['throughput_on_over_off']:.2f}x   hit rate on {on['hit_rate']:.1%} vs off "
          f"{off['hit_rate']:.1%}   busiest worker on: {on['max_worker_share']:.0%} of jobs")
    return ratios


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="random-small (built under benchmarks/results/models), a known "
                             "model name or a folder")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=520,
                        help="words per system prompt (~1.1 SmolLM2 tokens each)")
    parser.add_argument("--user-words", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16,
                        help="per worker: room for every conversation on either worker")
    parser.add_argument("--kv-cache-memory", type=int, default=512 << 20,
                        help="bytes per worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-cap", type=float, default=1.0,
                        help="placement_load_cap: a worker takes placed jobs while its jobs "
                             "stay under this multiple of its concurrency")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="let both workers use every core with torch's default threads "
                             "(by default each gets one core and one thread)")
    parser.add_argument("--quick", action="store_true",
                        help="4 conversations of 3 turns (a smoke run, not the figures)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/placement.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.conversations, args.turns = 4, 3
    return args


def _shortest_system_prompt(model: str, workload: Workload) -> int:
    """Tokens of the shortest system prompt, by the workers' own tokenizer."""
    from kvrelay_worker.loading import load_model_source

    tokenizer = load_model_source(model).tokenizer
    return min(len(tokenizer.encode(text)) for text in workload.system_prompts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model == DEFAULT_MODEL:
        args.model = str(random_small_model(Path("benchmarks/results/models/random-small")))
    workload = make_workload(args)
    runs: dict[str, dict[str, Any]] = {}
    jobs: dict[str, list[dict[str, Any]]] = {}
    for placement in (False, True):
        print(f"running with placement {'on' if placement else 'off'} ...", flush=True)
        result = run_once(args.model, workload, args, placement)
        name = "on" if placement else "off"
        runs[name] = result.summary()
        jobs[name] = [vars(job) for job in result.jobs]
    ratios = print_table(runs["off"], runs["on"])
    system_tokens = _shortest_system_prompt(args.model, workload)
    print(f"shortest system prompt: {system_tokens} tokens")
    write_result(args.out, "placement", args, {
        "shortest_system_prompt_tokens": system_tokens,
        "runs": runs, "ratios": ratios, "jobs": jobs,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
