"""Beam search reads back each beam's best candidates only, not its vocabulary.

A step copied every beam row's full log_softmax to the host (49,152 floats a beam for
SmolLM2) to rank candidates there. The best ``beams_to_keep`` candidates over all beams
are each among their own beam's best ``beams_to_keep`` (a beam's running score shifts
its whole row by one constant), so the engine takes that top-k on the device and reads
back k values and ids per beam; the search picks exactly what it picked from the whole
rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvrelay_worker.engine import LLM, SamplingParams, llm_engine
from kvrelay_worker.engine.beam.beam_group import BeamGroup, beam_candidates
from kvrelay_worker.engine.beam.beam_search import BeamSearch, beam_config

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[100 + (i % 7) for i in range(20)], [5, 9, 11, 300, 42, 17]]
PARAMS = SamplingParams(beam_width=3, n=2, length_penalty=1.2, max_tokens=10,
                        ignore_eos=True, stop_token_ids=[7])


def _beams(llm: LLM) -> list[list[tuple[list[int], float | None]]]:
    return [[(c.token_ids, c.beam_score) for c in out.choices]
            for out in llm.generate(PROMPTS, PARAMS)]


def test_each_beam_sends_k_candidates_and_the_beams_are_unchanged(
        folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No prefix caching: the second run must compute what the first did, not reuse it.
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=128, max_num_seqs=16,
              enable_prefix_caching=False)
    vocab = llm.engine.model.config.vocab_size
    received: list[int] = []
    add_row = BeamGroup.add_row

    def recording(self: BeamGroup, *args: Any) -> None:
        received.append(args[1].numel())
        add_row(self, *args)

    monkeypatch.setattr(BeamGroup, "add_row", recording)
    got = _beams(llm)
    # Width 3, one stop id: beams_to_keep = max(2, 1 + 1) * 3 = 6 values a beam.
    assert received
    assert set(received) == {6}
    assert vocab > 6
    # The same beams and scores as when every beam's whole row comes back.
    monkeypatch.setattr(llm_engine, "beam_candidates",
                        lambda logits, per_beam: beam_candidates(logits, vocab))
    received.clear()
    assert _beams(llm) == got
    assert set(received) == {vocab}


def test_a_step_from_the_top_k_equals_a_step_from_whole_rows() -> None:
    """Random rows over several steps, with stop ids and tied values: the search fed each
    beam's top ``beams_to_keep`` goes exactly as the search fed the whole rows."""
    generator = torch.Generator().manual_seed(3)
    config = beam_config(4, 0.8, False, [3, 11], 9)
    whole, top = BeamSearch(config), BeamSearch(config)
    k = whole.beams_to_keep
    while not whole.done:
        rows = torch.randn((whole.num_running, 40), generator=generator).log_softmax(-1)
        rows[:, 20] = rows[:, 21]  # ties inside a row
        best = rows.topk(k, dim=-1)
        every = torch.arange(rows.shape[1]).expand_as(rows)
        assert top.step_top(best.values, best.indices) == whole.step_top(rows, every)
    assert top.done
    assert top.best(4) == whole.best(4)
