"""A draft model's guesses come back to the host once per proposal, not once per token.

Each ``.tolist()`` of a device tensor is a copy and a wait for the device; the draft ran
one per draft token (depth 4: four waits a step). Its guesses now stay on the device,
feeding its next pass, and are read back together. The guesses themselves are unchanged:
with the model as its own draft they are the model's greedy continuation.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.engine.spec import draft_model
from kvrelay_worker.engine.spec.draft_model import DraftModel

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[100 + (i % 7) for i in range(40)], [5, 9, 11, 300, 42, 17], [64] * 19]
DEPTHS = [4, 2, 3]


def _counting_tolist(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the ``.tolist()`` calls made by the draft's own code (the attention
    reference's host-side bookkeeping on CPU is not the draft's read-back)."""
    calls: list[int] = []
    tolist = torch.Tensor.tolist

    def counted(self: torch.Tensor) -> Any:
        if sys._getframe(1).f_code.co_filename == draft_model.__file__:
            calls.append(1)
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return calls


def _draft(llm: LLM) -> DraftModel:
    speculator = llm.engine.speculator
    assert speculator is not None
    assert speculator.draft is not None
    return speculator.draft


def test_a_proposal_reads_its_guesses_back_once(folder: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(folder, device="cpu", dtype="float32", num_kv_blocks=64,
              speculative=f"draft:{folder}", speculative_adaptive=False)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = [out.token_ids for out in llm.generate(PROMPTS, greedy)]
    draft = _draft(llm)
    seqs = [Sequence(request_id=f"r{i}", choice_index=0, token_ids=list(p),
                     num_prompt_tokens=len(p), params=greedy) for i, p in enumerate(PROMPTS)]
    calls = _counting_tolist(monkeypatch)
    drafts = draft.propose(seqs, DEPTHS)
    assert len(calls) == 1
    monkeypatch.undo()
    assert drafts == [want[:depth] for want, depth in zip(expected, DEPTHS, strict=True)]
    # The next proposal, after the target accepted some drafts: the shadows held the
    # real guesses (not placeholders), so their KV is kept and the guesses go on.
    for seq, want, accepted in zip(seqs, expected, [3, 1, 0], strict=True):
        seq.token_ids.extend(want[: accepted + 1])
    calls = _counting_tolist(monkeypatch)
    more = draft.propose(seqs, [2, 2, 2])
    assert len(calls) == 1
    monkeypatch.undo()
    assert more == [want[accepted + 1 : accepted + 3]
                    for want, accepted in zip(expected, [3, 1, 0], strict=True)]
