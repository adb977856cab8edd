"""The sampler: every processing step against a reference, and seeded determinism.

Unit tests build batches the way the engine does (``build_sampling_batch`` over real
``Sequence`` objects) and compare the processed logits, masks, logprobs and tokens with
straightforward references (Hugging Face's repetition penalty processor, the OpenAI
penalty formula, per-row loops with sorting). Engine-level tests on a tiny model check
that a seeded request's tokens depend only on the seed, the choice, the position and the
logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from helpers.engine_run import assert_engine_idle, final_outputs, run_engine
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.sample.sampler import (
    Sampler,
    SamplingBatch,
    apply_penalties,
    apply_top_k_top_p_min_p,
)
from kvrelay_worker.engine.sample.sampling_batch import build_sampling_batch
from kvrelay_worker.engine.sched.sequence import Sequence as Seq

V = 50
EOS = 2
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


def make_seq(params: SamplingParams, prompt: Sequence[int] = (10, 11, 12),
             output: Sequence[int] = (), choice: int = 0) -> Seq:
    return Seq(request_id="r", choice_index=choice, token_ids=[*prompt, *output],
               num_prompt_tokens=len(prompt), params=params)


def batch_of(seqs: Sequence[Seq], vocab: int = V) -> SamplingBatch:
    return build_sampling_batch(seqs, vocab, (EOS,), CPU)


def random_logits(rows: int, vocab: int = V, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((rows, vocab), generator=gen) * scale


def sampler(seed: int = 0) -> Sampler:
    return Sampler(torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ greedy and top-k


def test_top_k_one_is_greedy() -> None:
    logits = random_logits(24)
    seqs = [make_seq(SamplingParams(temperature=t, top_k=1, top_p=p, seed=s))
            for t, p, s in zip([0.3, 1.0, 2.5] * 8, [1.0, 0.9, 0.5] * 8,
                               [None, 7, None, 8] * 6, strict=True)]
    for seed in range(5):
        out = sampler(seed)(logits.clone(), batch_of(seqs))
        assert out.token_ids == logits.argmax(dim=-1).tolist()


def test_mixed_greedy_and_random_rows() -> None:
    logits = random_logits(8, seed=1)
    greedy = SamplingParams(temperature=0.0)
    seeded = [SamplingParams(temperature=1.0, seed=100 + i) for i in range(4)]
    seqs = [make_seq(greedy if i % 2 == 0 else seeded[i // 2]) for i in range(8)]
    batch = batch_of(seqs)
    assert not batch.all_greedy
    out = sampler()(logits.clone(), batch)
    for row in range(0, 8, 2):
        assert out.token_ids[row] == int(logits[row].argmax())
    # A seeded row draws the same token alone as in the mixed batch.
    for row in range(1, 8, 2):
        alone = sampler(seed=99)(logits[row : row + 1].clone(), batch_of([seqs[row]]))
        assert alone.token_ids == [out.token_ids[row]]
    # A random row is really random: at temperature 1 over 50 tokens the seeded rows do
    # not all fall on the argmax.
    assert any(out.token_ids[r] != int(logits[r].argmax()) for r in range(1, 8, 2))


# ------------------------------------------------------------------ penalties


def test_repetition_penalty_matches_transformers() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = random_logits(5, seed=2)
    histories = [([1, 5, 5, 9], [3, 40]), ([7, 8], [8, 8, 49]), ([0], []), ([4, 6], [6]),
                 ([10, 20, 30], [11])]
    penalties = [1.3, 0.7, 2.0, 1.0, 1.8]
    seqs = [make_seq(SamplingParams(repetition_penalty=p), prompt, out)
            for p, (prompt, out) in zip(penalties, histories, strict=True)]
    ours = apply_penalties(logits.clone(), batch_of(seqs))
    for row, (penalty, seq) in enumerate(zip(penalties, seqs, strict=True)):
        processor = RepetitionPenaltyLogitsProcessor(penalty=penalty)
        ids = torch.tensor([seq.token_ids])
        expected = processor(ids, logits[row : row + 1].clone())[0]
        torch.testing.assert_close(ours[row], expected, rtol=0, atol=0)
    assert not torch.equal(ours[0], logits[0])


def test_presence_and_frequency_penalties_follow_openai() -> None:
    logits = random_logits(3, seed=3)
    rows = [
        (SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [1, 2, 3], [4, 4, 4, 9]),
        (SamplingParams(presence_penalty=-1.0, frequency_penalty=1.5), [4, 5], [5, 7, 7]),
        (SamplingParams(), [1, 2], [1, 1]),  # no penalties on this row
    ]
    seqs = [make_seq(p, prompt, out) for p, prompt, out in rows]
    ours = apply_penalties(logits.clone(), batch_of(seqs))
    for row, (params, _, output) in enumerate(rows):
        expected = logits[row].clone()
        for token in set(output):  # output tokens only: the prompt is not penalised
            count = output.count(token)
            expected[token] -= count * params.frequency_penalty + params.presence_penalty
        torch.testing.assert_close(ours[row], expected)


def test_bias_then_repetition_then_openai_penalties() -> None:
    logits = random_logits(1, seed=4)
    params = SamplingParams(logit_bias={3: 2.5, 7: -1.0, 60: 5.0}, repetition_penalty=1.5,
                            presence_penalty=0.3, frequency_penalty=0.2)
    seq = make_seq(params, prompt=[3, 9], output=[7, 7])
    ours = apply_penalties(logits.clone(), batch_of([seq]))
    expected = logits[0].clone()
    expected[3] += 2.5
    expected[7] -= 1.0
    for token in (3, 9, 7):
        value = expected[token]
        expected[token] = value * 1.5 if value < 0 else value / 1.5
    expected[7] -= 2 * 0.2 + 0.3
    torch.testing.assert_close(ours[0], expected)


def test_logit_bias_forces_and_forbids_tokens() -> None:
    # The bias range is the wire's [-100, 100]: the engine refuses what a client may not send.
    assert SamplingParams(logit_bias={1: 100, 2: -100.0}).logit_bias == {1: 100.0, 2: -100.0}
    with pytest.raises(ValueError, match=r"logit_bias\[\.\.\.\]: expected `float` <= 100.0"):
        SamplingParams(logit_bias={1: 500.0})
    logits = random_logits(2, seed=5)
    worst = int(logits[0].argmin())
    best = int(logits[1].argmax())
    seqs = [make_seq(SamplingParams(temperature=0.0, logit_bias={worst: 100.0})),
            make_seq(SamplingParams(temperature=0.0, logit_bias={best: -100.0}))]
    out = sampler()(logits.clone(), batch_of(seqs))
    assert out.token_ids[0] == worst
    assert out.token_ids[1] != best
    assert out.token_ids[1] == int(logits[1].topk(2).indices[1])


def test_bias_and_bans_work_on_inference_tensors() -> None:
    """The model runner's logits are made under inference mode; sampling must not need to
    change them in place (it would raise outside inference mode)."""
    with torch.inference_mode():
        logits = random_logits(2, seed=9)
    params = SamplingParams(temperature=0.0, logit_bias={5: 100.0}, min_tokens=2)
    out = sampler()(logits, batch_of([make_seq(params)] * 2))
    assert out.token_ids == [5, 5]


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros((4, V))
    logits[:, EOS] = 10.0
    logits[:, 7] = 9.0
    logits[:, 30] = 8.0
    def params(ignore_eos: bool = False) -> SamplingParams:
        return SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[7],
                              ignore_eos=ignore_eos)

    seqs = [
        make_seq(params(), output=[1]),  # 1 < 3: EOS and 7 banned
        make_seq(params(), output=[1, 1, 1]),  # reached: nothing banned
        make_seq(params(ignore_eos=True), output=[]),  # stop id banned only
        make_seq(SamplingParams(temperature=0.0), output=[]),  # no min_tokens
    ]
    batch = batch_of(seqs)
    processed = apply_penalties(logits.clone(), batch)
    assert math.isinf(processed[0, EOS])
    assert math.isinf(processed[0, 7])
    assert torch.isfinite(processed[1]).all()
    assert math.isfinite(processed[2, EOS])
    assert math.isinf(processed[2, 7])
    assert torch.isfinite(processed[3]).all()
    assert sampler()(logits.clone(), batch).token_ids == [30, EOS, EOS, EOS]


# ------------------------------------------------------------------ top-k / top-p / min-p


def reference_mask(row: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """True for tokens kept: HF order (top-k, then top-p on the renormalised rest, then
    min-p), one row, by sorting, in float64."""
    values = row.double()
    keep = torch.ones_like(values, dtype=torch.bool)
    order = values.argsort(descending=True).tolist()
    if top_k > 0:
        kth = values[order[min(top_k, len(order)) - 1]]
        keep &= values >= kth
    if top_p < 1.0:
        probs = torch.where(keep, values, torch.tensor(-math.inf, dtype=torch.float64))
        probs = probs.softmax(dim=0)
        mass = 0.0
        for i, token in enumerate(order):
            if i > 0 and mass >= top_p:
                keep[token] = False
            mass += float(probs[token])
    if min_p > 0.0:
        probs = torch.where(keep, values, torch.tensor(-math.inf, dtype=torch.float64))
        probs = probs.softmax(dim=0)
        keep &= probs >= min_p * probs.max()
    return keep


def test_top_k_top_p_min_p_masks_match_a_per_row_reference() -> None:
    settings = [(k, p, m) for k in (0, 1, 3, 17, V) for p in (1.0, 0.95, 0.6, 0.2)
                for m in (0.0, 0.05, 0.4)]
    logits = random_logits(len(settings), seed=6, scale=2.0)
    seqs = [make_seq(SamplingParams(temperature=1.0, top_k=k, top_p=p, min_p=m))
            for k, p, m in settings]
    batch = batch_of(seqs)
    masked = apply_top_k_top_p_min_p(logits.clone(), batch)
    for row, (k, p, m) in enumerate(settings):
        kept = torch.isfinite(masked[row])
        expected = reference_mask(logits[row], k, p, m)
        assert torch.equal(kept, expected), f"top_k={k} top_p={p} min_p={m}"
        torch.testing.assert_close(masked[row][kept], logits[row][kept])
    # The settings are not vacuous: every filter removed something somewhere.
    assert sum(int((~torch.isfinite(masked[r])).sum()) for r in range(len(settings))) > 0


def test_filters_never_let_a_masked_token_through() -> None:
    logits = random_logits(64, seed=7)
    seqs = [make_seq(SamplingParams(temperature=1.0, top_k=3, top_p=0.8, seed=i))
            for i in range(64)]
    batch = batch_of(seqs)
    kept = torch.isfinite(apply_top_k_top_p_min_p(logits.clone(), batch))
    out = sampler()(logits.clone(), batch)
    for row, token in enumerate(out.token_ids):
        assert kept[row, token]


# ------------------------------------------------------------------ logprobs


def test_logprobs_are_log_softmax_of_the_processed_logits() -> None:
    logits = random_logits(4, seed=8)
    rows = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=0.5, logprobs=3, repetition_penalty=1.4, seed=1),
        SamplingParams(temperature=2.0, logprobs=0, presence_penalty=1.0, seed=2),
        SamplingParams(temperature=1.0, top_k=2, logprobs=5, seed=3),
    ]
    seqs = [make_seq(p, prompt=[1, 2, 3], output=[4, 5]) for p in rows]
    batch = batch_of(seqs)
    assert batch.max_logprobs == 5
    out = sampler()(logits.clone(), batch)
    assert out.token_logprobs is not None
    assert out.top_ids is not None
    assert out.top_logprobs is not None
    penalised = apply_penalties(logits.clone(), batch)
    for row, params in enumerate(rows):
        temperature = params.temperature if params.temperature > 0 else 1.0
        expected = (penalised[row] / temperature).log_softmax(dim=0)
        token = out.token_ids[row]
        assert out.token_logprobs[row] == pytest.approx(float(expected[token]), abs=1e-5)
        top = expected.topk(5)
        assert out.top_ids[row] == top.indices.tolist()
        assert out.top_logprobs[row] == pytest.approx(top.values.tolist(), abs=1e-5)
        assert out.top_logprobs[row] == sorted(out.top_logprobs[row], reverse=True)
    # Before top-k filtering: the top_k=2 row still reports 5 finite alternatives.
    assert all(math.isfinite(v) for v in out.top_logprobs[3])
    assert out.token_ids[0] == out.top_ids[0][0]


def test_no_logprobs_unless_asked() -> None:
    out = sampler()(random_logits(2), batch_of([make_seq(SamplingParams())] * 2))
    assert out.token_logprobs is None
    assert out.top_ids is None


# ------------------------------------------------------------------ distributions


def chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    support = expected > 0
    assert counts[~support].sum() == 0, "a zero-probability token was drawn"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


# With 5 degrees of freedom, chi-square exceeds 30 with probability about 1.5e-5; a wrong
# distribution over 20000 draws scores in the hundreds.
CHI2_BOUND = 30.0
ROW = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_unseeded_draws_follow_the_softmax(temperature: float) -> None:
    n = 20000
    logits = ROW.repeat(n, 1)
    params = SamplingParams(temperature=temperature)
    batch = batch_of([make_seq(params)] * n, vocab=6)
    tokens = sampler(seed=123)(logits, batch).token_ids
    assert chi_square(tokens, (ROW / temperature).softmax(dim=0)) < CHI2_BOUND


def test_seeded_draws_follow_the_softmax_across_seeds_and_positions() -> None:
    n = 3000
    logits = ROW.repeat(n, 1)
    probs = ROW.softmax(dim=0)
    across_seeds = [make_seq(SamplingParams(temperature=1.0, seed=s)) for s in range(n)]
    tokens = sampler()(logits.clone(), batch_of(across_seeds, vocab=6)).token_ids
    assert chi_square(tokens, probs) < CHI2_BOUND
    one_seed = SamplingParams(temperature=1.0, seed=42)
    across_positions = [make_seq(one_seed, output=[0] * i) for i in range(n)]
    tokens = sampler()(logits.clone(), batch_of(across_positions, vocab=6)).token_ids
    assert chi_square(tokens, probs) < CHI2_BOUND
    across_choices = [make_seq(one_seed, choice=i) for i in range(n)]
    tokens = sampler()(logits.clone(), batch_of(across_choices, vocab=6)).token_ids
    assert chi_square(tokens, probs) < CHI2_BOUND


def test_filtered_draws_follow_the_renormalised_distribution() -> None:
    n = 20000
    logits = ROW.repeat(n, 1)
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.85)
    tokens = sampler(seed=5)(logits, batch_of([make_seq(params)] * n, vocab=6)).token_ids
    keep = reference_mask(ROW, 4, 0.85, 0.0)
    assert keep.tolist() == [True, True, True, False, False, False]
    probs = torch.where(keep, ROW, torch.tensor(-math.inf)).softmax(dim=0)
    assert chi_square(tokens, probs) < CHI2_BOUND


# ------------------------------------------------------------------ engine level


def make_llm(folder: str, seed: int = 0) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64, seed=seed)


PROMPT = random_prompts([30], seed=31)[0]
SEEDED = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234,
                        ignore_eos=True)


def test_top_k_one_equals_greedy_in_the_engine(folder: str) -> None:
    llm = make_llm(folder)
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0.0,
                                                   ignore_eos=True))[0]
    top1 = llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.7, top_k=1,
                                                 ignore_eos=True))[0]
    assert top1.token_ids == greedy.token_ids


def test_seeded_request_is_independent_of_its_neighbours(folder: str) -> None:
    alone = make_llm(folder).generate([PROMPT], SEEDED)[0].token_ids
    assert len(alone) == 16
    neighbours = random_prompts([5, 12, 40, 3, 25, 60, 9], seed=32)
    neighbour_params = [
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0.7, seed=1234, ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=1.2, top_k=5, repetition_penalty=1.3,
                       ignore_eos=True),
        SamplingParams(max_tokens=3, temperature=0.9, min_p=0.1, seed=9, ignore_eos=True),
        SamplingParams(max_tokens=18, temperature=0.5, presence_penalty=1.0, logprobs=2,
                       ignore_eos=True),
        SamplingParams(max_tokens=7, temperature=1.0, n=2, ignore_eos=True),
    ]
    # A different engine seed too: a seeded request ignores the engine's generator.
    llm = make_llm(folder, seed=77)
    outputs = llm.generate([neighbours[0], neighbours[1], neighbours[2], PROMPT, *neighbours[3:]],
                           [*neighbour_params[:3], SEEDED, *neighbour_params[3:]])
    assert outputs[3].token_ids == alone
    assert llm.engine.stats()["max_batch_size"] >= 8


def test_seeded_request_resumes_with_the_same_tokens(folder: str) -> None:
    llm = make_llm(folder)
    full = llm.generate([PROMPT], SEEDED)[0]
    tokens = full.token_ids
    engine = llm.engine
    for k in (1, 6, 15):
        prior_text = engine.tokenizer.decode(tokens[:k], skip_special_tokens=True)
        engine.add_request(f"resume-{k}", PROMPT, SEEDED, prior_outputs=[tokens[:k]],
                           prior_texts=[prior_text])
        steps = run_engine(engine)[f"resume-{k}"]
        new_ids = [t for s in steps for d in s.deltas for t in d.token_ids]
        assert new_ids == tokens[k:], f"resumed after {k} tokens"
        out = final_outputs({"r": steps})["r"]
        assert out.token_ids == tokens
        assert out.text == full.text
    assert_engine_idle(engine)


def test_choices_are_seeded_by_their_index(folder: str) -> None:
    llm = make_llm(folder)
    single = llm.generate([PROMPT], SEEDED)[0]
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234, n=3,
                            ignore_eos=True)
    multi = llm.generate([PROMPT], params)[0]
    assert multi.choices[0].token_ids == single.token_ids
    assert multi.choices[1].token_ids != multi.choices[0].token_ids
    assert multi.choices[2].token_ids != multi.choices[1].token_ids
    again = make_llm(folder).generate([PROMPT], params)[0]
    assert [c.token_ids for c in again.choices] == [c.token_ids for c in multi.choices]


def test_unseeded_sampling_depends_on_the_engine_seed(folder: str) -> None:
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    first = make_llm(folder, seed=1).generate([PROMPT], params)[0].token_ids
    same = make_llm(folder, seed=1).generate([PROMPT], params)[0].token_ids
    other = make_llm(folder, seed=2).generate([PROMPT], params)[0].token_ids
    assert first == same
    assert first != other


def test_min_tokens_in_the_engine(folder: str) -> None:
    """EOS pushed to the top by a bias still waits for min_tokens, then stops."""
    llm = make_llm(folder)
    params = SamplingParams(max_tokens=20, temperature=0.0, min_tokens=5,
                            logit_bias={EOS: 100.0})
    out = llm.generate([PROMPT], params)[0]
    assert len(out.token_ids) == 6
    assert EOS not in out.token_ids[:5]
    assert out.token_ids[5] == EOS
    assert out.finish_reason == "stop"
