"""Host time to build a step's sampling tensors at 128 sequences × 4k tokens, on CPU.

    python benchmarks/sampling_host_time.py [--seqs 128] [--context 4096] [--steps 20]

Every sequence asks for repetition, presence and frequency penalties, 300 logit-bias
entries and ``min_tokens`` (so its EOS and stop ids are banned). Each step builds the
batch, then every sequence gains one token, as in decoding. Two ways are timed when the
code has both: ``rebuild`` (``build_sampling_batch``: everything from every token and
every parameter, each step: what the engine did before per-sequence state) and
``incremental`` (``SamplingBatchBuilder``: penalty rows updated by the new token,
per-request tables built once: what the engine does now). Run it against an older tree
(``PYTHONPATH=<old>/worker:...``) to time the old code's ``build_sampling_batch``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from harness import write_result

from kvrelay_worker.engine.sample import sampling_batch
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence as EngineSequence

VOCAB = 49152  # SmolLM2's
EOS = (0, 2)


def make_sequences(num_seqs: int, context: int, seed: int = 0) -> list[EngineSequence]:
    rng = random.Random(seed)
    bias = {rng.randrange(VOCAB): rng.uniform(-5, 5) for _ in range(300)}
    params = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.1,
                            presence_penalty=0.2, frequency_penalty=0.2, logit_bias=bias,
                            min_tokens=10_000, max_tokens=20_000,
                            stop_token_ids=[rng.randrange(VOCAB) for _ in range(8)], seed=1)
    seqs = []
    for i in range(num_seqs):
        prompt = [rng.randrange(VOCAB) for _ in range(context - 16)]
        output = [rng.randrange(VOCAB) for _ in range(16)]
        seqs.append(EngineSequence(request_id=f"r{i}", choice_index=0,
                                   token_ids=prompt + output, num_prompt_tokens=len(prompt),
                                   params=params))
    return seqs


def time_steps(build: Callable[[Sequence[EngineSequence]], Any], seqs: list[EngineSequence],
               steps: int) -> list[float]:
    """CPU seconds of this process per step: on a shared machine wall time mostly
    measures the neighbours."""
    rng = random.Random(1)
    times = []
    for _ in range(steps):
        start = time.process_time()
        build(seqs)
        times.append(time.process_time() - start)
        for s in seqs:
            s.append_token(rng.randrange(VOCAB))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=128)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/sampling_host_time.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    ways: dict[str, Callable[[Sequence[EngineSequence]], Any]] = {
        "rebuild": lambda seqs: sampling_batch.build_sampling_batch(seqs, VOCAB, EOS, cpu),
    }
    if hasattr(sampling_batch, "SamplingBatchBuilder"):
        ways["incremental"] = sampling_batch.SamplingBatchBuilder(VOCAB, EOS, cpu).build
    results: dict[str, Any] = {"seqs": args.seqs, "context": args.context,
                               "steps": args.steps, "threads": args.threads, "ms": {}}
    print(f"{args.seqs} sequences x {args.context} tokens, vocab {VOCAB}, "
          f"{args.threads} torch thread(s); CPU ms per step (median, p90 of {args.steps})")
    for name, build in ways.items():
        times = time_steps(build, make_sequences(args.seqs, args.context), args.steps)
        ms = sorted(t * 1e3 for t in times)
        median, p90 = statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]
        results["ms"][name] = {"median": median, "p90": p90, "first": times[0] * 1e3}
        print(f"{name:>12}: median {median:7.2f}  p90 {p90:7.2f}  first step "
              f"{times[0] * 1e3:7.2f}")
    write_result(args.out, "sampling_host_time", args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
