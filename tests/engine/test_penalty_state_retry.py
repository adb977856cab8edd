"""A penalty-table update that fails leaves every row to be synced again on the retry.

The engine retries a failed step without the request that broke it; the sequences that
shared the failed step must still get their new tokens into the penalty tables then.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_worker.engine.sample.penalty_state import PenaltyState
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence

VOCAB = 50


def seq(tokens: list[int], prompt: int) -> Sequence:
    return Sequence(request_id="r", choice_index=0, token_ids=tokens, num_prompt_tokens=prompt,
                    params=SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5))


def test_a_failed_update_is_redone_for_the_innocent_rows() -> None:
    state = PenaltyState(VOCAB, torch.device("cpu"))
    innocent = seq([1, 2, 3, 7, 7], prompt=3)
    culprit = seq([4, 5, VOCAB + 9], prompt=2)  # a token the tables cannot hold
    with pytest.raises(IndexError):
        state.rows_for([innocent, culprit], [True, True])
    (row,) = state.rows_for([innocent], [True])
    assert state.seen[row].nonzero().flatten().tolist() == [1, 2, 3, 7]
    assert state.counts[row, 7].item() == 2.0
    assert state.counts[row].sum().item() == 2.0
