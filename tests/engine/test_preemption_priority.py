"""Priority under KV pressure: the preemption victim is the lowest-priority, newest running
sequence even when it is already in the step's batch (it is taken out again, its tokens
and this step's blocks given back), so a high-priority sequence never loses its blocks
while a low-priority one keeps its own. Checked on the scheduler alone and on the engine
with a tiny random model, whose greedy outputs must not change under the preemptions."""

from __future__ import annotations

import pytest
from helpers.engine_run import assert_engine_idle, final_outputs
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams, StepOutput
from kvrelay_worker.engine.beam.beam_scheduling import reseat_beams
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv.swap_space import SwapSpace
from kvrelay_worker.engine.sched.preemption import PreemptionPolicy
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.scheduler_output import SchedulerOutput
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus

pytestmark = pytest.mark.usefixtures("one_thread")

BS = 4
SAMPLED = 7  # the token every sampling row gets in the scheduler-level tests


def _seq(name: str, prompt_len: int, priority: int, arrival: int,
         max_tokens: int = 4) -> Sequence:
    return Sequence(request_id=name, choice_index=0, token_ids=list(range(1, prompt_len + 1)),
                    num_prompt_tokens=prompt_len,
                    params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    priority=priority, arrival_order=arrival)


def _step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sched.update_from_output(out.layout, [SAMPLED] * out.layout.num_rows)
    return out


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_low_priority_sequence_already_batched_is_the_victim(mode: str) -> None:
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_caching=False, model_id="m")
    swap = SwapSpace(8) if mode == "swap" else None
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=16, swap=swap,
                      preemption=PreemptionPolicy("swap" if mode == "swap" else "recompute"))
    low = _seq("low", 7, priority=0, arrival=0, max_tokens=6)
    sched.add(low)
    _step(sched)  # low is admitted first: 7 tokens in 2 blocks
    high_a = _seq("a", 4, priority=10, arrival=1)
    high_b = _seq("b", 4, priority=10, arrival=2)
    sched.add(high_a)
    sched.add(high_b)
    _step(sched)  # a and b admitted, a block each; low's 8th token fits its 2nd block
    assert sched.running == [low, high_a, high_b]
    assert kv.num_free_blocks == 1
    # The pressured step: low goes first and takes the last free block for its 9th token;
    # then a needs a block for its 5th. The budget holds exactly two decodes: b is in the
    # batch only if low's token is given back when low is taken out of it.
    sched.max_num_batched_tokens = 2
    out = _step(sched)
    assert out.preempted == [low], "a high-priority sequence lost its blocks to a lower one"
    assert [item.seq for item in out.scheduled] == [high_a, high_b]
    assert low not in sched.running
    assert low.status is (SequenceStatus.SWAPPED if mode == "swap" else SequenceStatus.WAITING)
    assert kv.num_blocks_held(low) == 0
    assert kv.num_free_blocks == 1  # low's 3 blocks back; a and b took one each
    if mode == "swap":
        # Only the blocks of low's 8 computed tokens are copied out, not the one this
        # step had just given it for its 9th.
        assert len(out.swap_out) == 2
        assert low.num_computed_tokens == 8
    else:
        assert out.swap_out == []
        assert low.num_computed_tokens == 0
    sched.max_num_batched_tokens = 16
    for _ in range(50):
        if not sched.has_unfinished():
            break
        _step(sched)
    assert not sched.has_unfinished()
    assert (high_a.num_preemptions, high_b.num_preemptions) == (0, 0)
    assert low.output_token_ids == [SAMPLED] * 6
    assert high_a.output_token_ids == high_b.output_token_ids == [SAMPLED] * 4
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"
    assert swap is None or swap.num_free_blocks == swap.num_blocks, "host blocks leaked"


def test_a_low_priority_sequence_that_needs_room_preempts_itself() -> None:
    """Going first in the batch gives no claim on a higher-priority sequence's blocks."""
    kv = KVCacheManager(num_blocks=2, block_size=BS, enable_caching=False, model_id="m")
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=16)
    low = _seq("low", 3, priority=0, arrival=0)
    sched.add(low)
    _step(sched)
    high = _seq("high", 4, priority=10, arrival=1)
    sched.add(high)
    _step(sched)  # a block each: the pool is full
    assert sched.running == [low, high]
    out = _step(sched)  # both need a second block; low is placed first
    assert out.preempted == [low]
    assert [item.seq for item in out.scheduled] == [high]
    assert kv.num_blocks_held(high) == 2


def _beams(name: str, priority: int, arrival: int) -> list[Sequence]:
    """A beam request's two beams: the first with a 6-token prompt, the second to be forked."""
    params = SamplingParams(beam_width=2, max_tokens=4)
    return [Sequence(request_id=name, choice_index=i, token_ids=list(range(1, 7)) if i == 0
                     else [], num_prompt_tokens=6, params=params, priority=priority,
                     arrival_order=arrival) for i in range(2)]


def test_a_batched_low_priority_beam_group_is_preempted_as_a_unit() -> None:
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_caching=False, model_id="m")
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=16)
    low, high = _beams("low", priority=0, arrival=0), _beams("high", priority=10, arrival=1)
    sched.add(low[0])
    _step(sched)  # the low-priority request is admitted first: 6 tokens in 2 blocks
    reseat_beams(sched, low, [0, 0], [7, 8])
    sched.add(high[0])
    _step(sched)  # the high one is admitted: 2 blocks; low's first beam copied on write
    # Beams advance together; low's reseat comes first, so its beams are placed first.
    reseat_beams(sched, low, [0, 0], [9, 9])  # both low beams share both their blocks
    reseat_beams(sched, high, [0, 0], [7, 8])  # both high beams share both theirs
    assert sched.running == [*low, *high]
    assert kv.num_free_blocks == 1
    shared_high_block = high[0].block_table[1]
    # The pressured step: low's first beam writes into its shared partial block, takes the
    # last free block and queues a copy into it; then high's first beam needs one too.
    out = _step(sched)
    assert set(out.preempted) == set(low), "the low beam group, whole, is the victim"
    assert [item.seq for item in out.scheduled] == high
    # Only high's own copy-on-write is left: a copy into a block the victim gave back
    # would land on that block's next owner.
    assert out.copies == [(shared_high_block, high[0].block_table[1])]
    assert all(kv.num_blocks_held(beam) == 0 for beam in low)
    assert kv.num_free_blocks == 2  # low's 3 blocks back; high's first beam took one
    for beam in (*low, *high):
        sched.finish(beam, SequenceStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished()
    assert kv.num_free_blocks == kv.num_blocks, "blocks leaked"


# ------------------------------------------------------------------ engine, tiny model

# 40 blocks of 8 tokens = 320 slots for about 400 tokens of work: preemption must happen.
POOL = {"num_kv_blocks": 40, "block_size": 8, "max_model_len": 128, "max_num_seqs": 8}
LOW = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
HIGH = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
NUM_HIGH = 5


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_the_low_priority_job_admitted_first_is_the_one_preempted(mode: str,
                                                                  folder: str) -> None:
    prompts = random_prompts([16] * (NUM_HIGH + 1), seed=30)
    llm = LLM(folder, device="cpu", dtype="float32", preemption_mode=mode,
              num_swap_blocks=64 if mode == "swap" else None, **POOL)
    engine = llm.engine
    engine.add_request("low", prompts[0], LOW, priority=0)
    outputs: dict[str, list[StepOutput]] = {}
    for out in engine.step():  # the low-priority job is running before the others arrive
        outputs.setdefault(out.request_id, []).append(out)
    low = engine.requests["low"].choices[0].seq
    assert low.status is SequenceStatus.RUNNING
    highs = []
    for i, prompt in enumerate(prompts[1:]):
        engine.add_request(f"high{i}", prompt, HIGH, priority=10)
        highs.append(engine.requests[f"high{i}"].choices[0].seq)
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        before = [s.num_preemptions for s in highs]
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        if [s.num_preemptions for s in highs] != before:
            # A high-priority job may only lose its blocks to another high-priority one
            # once the low-priority job holds none (preempted earlier in this step).
            assert low.status is not SequenceStatus.RUNNING, (
                "a high-priority job was preempted while the low-priority one kept its blocks")
    assert not engine.has_unfinished_requests()
    assert low.num_preemptions > 0, "the pool was never short: the test proves nothing"
    assert engine.stats()["preemptions"] >= low.num_preemptions
    assert_engine_idle(engine)
    finals = final_outputs(outputs)
    # Greedy output is what an engine with room for everyone produces.
    roomy = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=256, block_size=8,
                max_model_len=128, max_num_seqs=8)
    expected = roomy.generate(prompts, [LOW] + [HIGH] * NUM_HIGH)
    assert roomy.engine.stats()["preemptions"] == 0
    assert finals["low"].token_ids == expected[0].token_ids
    for i in range(NUM_HIGH):
        assert finals[f"high{i}"].token_ids == expected[i + 1].token_ids, f"high{i} diverged"
