"""Prompt chunks sized against a latency target, with the step costs injected (no clock).

The cost model learns from synthetic step times of a known formula, so what each chunk
is predicted to cost is known exactly; a scheduler run shows decodes keeping their pace
while a long prompt still completes.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.prefill_pacing import PrefillPacer
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.scheduler_output import SchedulerOutput
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.engine.sched.step_cost import StepCostModel, StepShape

# ms = 5 + 1 per decode row + 0.1 per prompt token + 2 per million attention pairs
COEF = np.array([5.0, 1.0, 0.0, 0.1, 2.0])


def machine_ms(shape: StepShape) -> float:
    return float(np.dot(COEF, shape.features()))


def trained_model() -> StepCostModel:
    """A cost model that has measured enough varied steps to know ``machine_ms``."""
    model = StepCostModel()
    for rows, decode_context in ((1, 50), (4, 900), (8, 200), (16, 3000), (24, 600)):
        for context, chunk in ((0, 64), (500, 512), (2000, 256), (4000, 1024), (0, 0)):
            shape = StepShape.of([(decode_context, 1)] * rows)
            if chunk:
                shape = shape.plus_prefill(context, chunk)
            model.observe(shape, machine_ms(shape))
    np.testing.assert_allclose(model.coefficients, COEF, atol=1e-3)
    return model


def test_a_chunk_is_the_largest_the_target_allows() -> None:
    pacer = PrefillPacer(target_ms=60.0, min_chunk=16, model=trained_model())
    decodes = StepShape.of([(300, 1)] * 16)  # 21 ms of the 60
    for context in (0, 1000, 3000):
        chunk = pacer.chunk(decodes, context, remaining=5000, first=True)
        assert machine_ms(decodes.plus_prefill(context, chunk)) <= 60.0
        assert machine_ms(decodes.plus_prefill(context, chunk + 1)) > 60.0
    # Deeper in a prompt each token attends to more: chunks shrink.
    assert (pacer.chunk(decodes, 0, 5000, True) > pacer.chunk(decodes, 1000, 5000, True)
            > pacer.chunk(decodes, 3000, 5000, True))


def test_a_prompt_never_gets_less_than_the_minimum_chunk() -> None:
    pacer = PrefillPacer(target_ms=10.0, min_chunk=16, model=trained_model())
    busy = StepShape.of([(300, 1)] * 40)  # the decodes alone take 45 ms
    assert pacer.chunk(busy, 2000, remaining=5000, first=True) == 16
    assert pacer.chunk(busy, 2000, remaining=5, first=True) == 5
    assert pacer.chunk(busy, 2000, remaining=5000, first=False) == 0


def test_a_cold_model_grows_chunks_only_as_fast_as_it_measures() -> None:
    pacer = PrefillPacer(target_ms=1000.0, min_chunk=32)
    shape = StepShape.of([(10, 1)] * 4)
    sizes = []
    context = 0
    for _ in range(5):
        chunk = pacer.chunk(shape, context, remaining=100_000, first=True)
        sizes.append(chunk)
        measured = shape.plus_prefill(context, chunk)
        pacer.observe(measured, machine_ms(measured))
        context += chunk
    assert sizes == [32, 64, 128, 256, 512]


def new_seq(prompt_len: int, max_tokens: int, order: int) -> Sequence:
    return Sequence(request_id=f"r{order}", choice_index=0, token_ids=[1] * prompt_len,
                    num_prompt_tokens=prompt_len,
                    params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    arrival_order=order)


def run_step(sched: Scheduler) -> SchedulerOutput:
    """Schedule a step, "run" it (token 0 for every sampling row) and report its cost."""
    out = sched.schedule()
    sched.update_from_output(out.layout, [0] * out.layout.num_rows)
    sched.observe_step(out, machine_ms(out.shape))
    return out


@pytest.mark.parametrize("target_ms", [40.0, 5.0])
def test_a_long_prompt_completes_while_decodes_keep_their_pace(target_ms: float) -> None:
    """16 decoding streams; a 3000-token prompt arrives. Every step keeps all 16 decodes,
    steps with prompt work stay within the target (when the decodes leave room for the
    minimum chunk), and the prompt finishes. At 5 ms the decodes alone are over target:
    the prompt still progresses by the minimum chunk."""
    kv = KVCacheManager(512, 16, False, model_id="m")
    pacer = PrefillPacer(target_ms, min_chunk=32, model=trained_model())
    sched = Scheduler(kv, max_num_seqs=32, max_num_batched_tokens=2048, pacer=pacer)
    decoders = [new_seq(8, 1000, i) for i in range(16)]
    for seq in decoders:
        sched.add(seq)
    while any(seq.num_output_tokens == 0 for seq in decoders):  # their prompts first
        run_step(sched)
    long_prompt = new_seq(3000, 1, 99)
    sched.add(long_prompt)
    steps = 0
    while not long_prompt.is_finished:
        steps += 1
        assert steps < 200, "the long prompt starved"
        out = run_step(sched)
        rows = {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}
        assert all(rows.get(seq.seq_id) == 1 for seq in decoders), "a decode was skipped"
        chunk = rows.get(long_prompt.seq_id, 0)
        assert chunk >= 1
        if chunk > 32:
            assert machine_ms(out.shape) <= target_ms
    assert long_prompt.num_computed_tokens == 3000
    if target_ms == 5.0:
        assert steps == -(-3000 // 32)  # the minimum chunk, every step


def test_without_a_pacer_the_fixed_budget_is_unchanged() -> None:
    kv = KVCacheManager(512, 16, False, model_id="m")
    sched = Scheduler(kv, max_num_seqs=32, max_num_batched_tokens=2048)
    sched.add(new_seq(3000, 1, 0))
    assert sched.schedule().num_batched_tokens == 2048
