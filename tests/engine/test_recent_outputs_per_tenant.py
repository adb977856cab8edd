"""The cross-request n-gram memory is per tenant: a request is never proposed the
continuation of another tenant's recent output (drafts would leak it one accepted token
at a time), while requests of the same tenant keep sharing it."""

from __future__ import annotations

from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus
from kvrelay_worker.engine.spec.speculator import Speculator

SECRET = [501, 502, 503, 504, 505, 506, 507, 508]


def _sequence(request_id: str, prompt: list[int], salt: str | None) -> Sequence:
    return Sequence(request_id=request_id, choice_index=0, token_ids=list(prompt),
                    num_prompt_tokens=len(prompt), params=SamplingParams(max_tokens=64),
                    cache_salt=salt)


def _drafts_for(salt: str | None, finished_salt: str | None) -> list[int]:
    speculator = Speculator(max_drafts=4, ngram_min=2, ngram_max=3, max_model_len=512,
                            adaptive=False)
    # A finished request of ``finished_salt`` whose answer was SECRET.
    done = _sequence("a", [1, 2, 3], finished_salt)
    done.status = SequenceStatus.RUNNING
    done.num_computed_tokens = done.num_tokens - 1
    speculator.propose([done], 0)
    done.token_ids.extend(SECRET)
    done.status = SequenceStatus.FINISHED_STOPPED
    # A running request whose tokens end with the first two tokens of SECRET.
    asking = _sequence("b", [9, 8, 7, SECRET[0], SECRET[1]], salt)
    asking.status = SequenceStatus.RUNNING
    asking.num_computed_tokens = asking.num_tokens - 1
    speculator.propose([asking], 0)
    return asking.draft_token_ids


def test_another_tenants_output_is_never_proposed() -> None:
    assert _drafts_for("tenant:bob", finished_salt="tenant:alice") == []
    assert _drafts_for(None, finished_salt="tenant:alice") == []


def test_the_same_tenants_outputs_are_still_shared() -> None:
    assert _drafts_for("tenant:alice", finished_salt="tenant:alice") == SECRET[2:6]
    assert _drafts_for(None, finished_salt=None) == SECRET[2:6]
