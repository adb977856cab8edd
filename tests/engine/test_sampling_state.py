"""Per-sequence sampling state kept between steps equals what a fresh build computes.

The engine's ``SamplingBatchBuilder`` updates penalty rows with each step's new tokens
and builds bias/ban tables once per sequence; ``build_sampling_batch`` (a fresh builder)
computes everything from scratch, as the engine did before. Every step of a random walk
(tokens appended, sequences joining, finishing, preempted) must give the same tensors,
and an engine run with penalties, bias, min_tokens and seeds must give the same tokens.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts

import kvrelay_worker.engine.sample.sampling_batch as sampling_batch_module
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.sample.sampler import SamplingBatch
from kvrelay_worker.engine.sample.sampling_batch import (
    RequestTokenTables,
    SamplingBatchBuilder,
    build_sampling_batch,
)
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus

V = 40
EOS = (2, 3)
CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_thread")


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.8]),
        repetition_penalty=rng.choice([1.0, 1.3]),
        presence_penalty=rng.choice([0.0, 0.5]),
        frequency_penalty=rng.choice([0.0, -0.4]),
        logit_bias=rng.choice([None, {1: 5.0, 7: -3.0, V + 5: 1.0}]),
        min_tokens=rng.choice([0, 3]),
        stop_token_ids=rng.choice([None, [9, 11]]),
        ignore_eos=rng.choice([False, True]),
        max_tokens=50,
    )


def new_seq(rng: random.Random, index: int) -> Sequence:
    prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 30))]
    return Sequence(request_id=f"r{index}", choice_index=0, token_ids=prompt,
                    num_prompt_tokens=len(prompt), params=random_params(rng))


def assert_same_batch(ours: SamplingBatch, fresh: SamplingBatch) -> None:
    for name in ("seen_mask", "output_counts", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "bias_values", "temperature", "greedy"):
        a, b = getattr(ours, name), getattr(fresh, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), name
    for name in ("bias_index", "ban_index"):
        a, b = getattr(ours, name), getattr(fresh, name)
        assert (a is None) == (b is None), name
        if a is not None:
            pairs_a = sorted(zip(a[0].tolist(), a[1].tolist()))
            pairs_b = sorted(zip(b[0].tolist(), b[1].tolist()))
            assert pairs_a == pairs_b, name
    if ours.bias_index is not None and fresh.bias_index is not None:
        assert torch.equal(ours.bias_index[0], fresh.bias_index[0])  # same entry order


@pytest.mark.parametrize("seed", range(4))
def test_incremental_state_equals_a_fresh_build_every_step(seed: int) -> None:
    rng = random.Random(seed)
    builder = SamplingBatchBuilder(V, EOS, CPU)
    live = [new_seq(rng, i) for i in range(5)]
    made = len(live)
    for _ in range(60):
        batch_seqs = [s for s in live if rng.random() < 0.8]  # some sit out (preempted)
        if batch_seqs:
            assert_same_batch(builder.build(batch_seqs),
                              build_sampling_batch(batch_seqs, V, EOS, CPU))
        for s in batch_seqs:
            s.append_token(rng.randrange(V))
        if rng.random() < 0.2:
            done = live.pop(rng.randrange(len(live)))
            done.status = SequenceStatus.FINISHED_STOPPED
        if rng.random() < 0.25 or not live:
            live.append(new_seq(rng, made))
            made += 1
    for s in live:
        s.status = SequenceStatus.FINISHED_ABORTED
    builder.build([new_seq(rng, made)])  # sweeps what finished
    assert builder.num_tracked <= 2  # only the newcomer (its tables and/or its row)


def test_a_reused_penalty_row_starts_empty() -> None:
    builder = SamplingBatchBuilder(V, EOS, CPU)
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0, max_tokens=9)
    first = Sequence(request_id="a", choice_index=0, token_ids=[5, 6, 7, 8],
                     num_prompt_tokens=2, params=params)
    builder.build([first])
    first.status = SequenceStatus.FINISHED_STOPPED
    second = Sequence(request_id="b", choice_index=0, token_ids=[1],
                      num_prompt_tokens=1, params=params)
    batch = builder.build([second])
    assert batch.seen_mask is not None
    assert batch.output_counts is not None
    assert batch.seen_mask.nonzero().tolist() == [[0, 1]]
    assert int(batch.output_counts.count_nonzero()) == 0


def test_request_tables_are_built_once_per_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logit bias and min-tokens bans are read from the params once, not every step."""
    built: list[str] = []
    original = RequestTokenTables.of.__func__  # type: ignore[attr-defined]

    def counting(cls: type[RequestTokenTables], seq: Sequence, *args: object
                 ) -> RequestTokenTables:
        built.append(seq.request_id)
        return original(cls, seq, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(sampling_batch_module.RequestTokenTables, "of", classmethod(counting))
    builder = SamplingBatchBuilder(V, EOS, CPU)
    bias = {t: 1.0 for t in range(30)}
    seqs = [Sequence(request_id=f"r{i}", choice_index=0, token_ids=[1, 2],
                     num_prompt_tokens=2,
                     params=SamplingParams(logit_bias=bias, min_tokens=5, max_tokens=20))
            for i in range(3)]
    for _ in range(10):
        builder.build(seqs)
        for s in seqs:
            s.append_token(4)
    assert sorted(built) == ["r0", "r1", "r2"]


def test_engine_tokens_equal_those_of_a_fresh_build_every_step(folder: str) -> None:
    """Penalties, bias, min_tokens and seeds through a real engine: identical tokens."""
    prompts = random_prompts([5, 12, 30, 8], seed=21)
    params = [
        SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=1.4,
                       frequency_penalty=0.3),
        SamplingParams(max_tokens=16, temperature=0.9, seed=7, presence_penalty=0.6,
                       logit_bias={5: 2.0, 17: -4.0}),
        SamplingParams(max_tokens=16, temperature=0.0, min_tokens=6, logit_bias={3: 1.5}),
        SamplingParams(max_tokens=16, temperature=0.7, seed=11, n=2,
                       repetition_penalty=0.8),
    ]

    def generate(fresh_every_step: bool) -> list[list[list[int]]]:
        llm = LLM(folder, device="cpu", dtype="float32", max_num_batched_tokens=16)
        engine = llm.engine
        if fresh_every_step:
            engine.sampling_batches.build = lambda seqs, offsets=None: (  # type: ignore[method-assign]
                build_sampling_batch(seqs, engine.vocab_size, engine.eos_token_ids,
                                     engine.device))
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            engine.add_request(f"r{i}", prompt, p)
        finals = final_outputs(run_engine(engine))
        assert_engine_idle(engine)
        return [[c.token_ids for c in finals[f"r{i}"].choices] for i in range(len(prompts))]

    assert generate(fresh_every_step=False) == generate(fresh_every_step=True)
