"""Fewer waits for the device per step: what the host reads back, and how it sends ids.

- The sampler reads a step's tokens, their logprobs and the top-k of each row back in one
  copy (each ``.tolist()`` of a device tensor is a copy and a wait for the device); the
  values are those of the plain computation.
- Swap and copy-on-write send their block id lists through ``host_to_device`` (pinned
  memory and a queued copy on CUDA), not ``torch.tensor(ids, device=...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvrelay_worker.engine.kv import block_copy, kv_swap
from kvrelay_worker.engine.sample.sampler import Sampler
from kvrelay_worker.engine.sample.sampling_batch import SamplingBatchBuilder
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.sequence import Sequence

VOCAB = 50


def _counting_tolist(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    tolist = torch.Tensor.tolist

    def counted(self: torch.Tensor) -> Any:
        calls.append(1)
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return calls


@pytest.mark.parametrize("logprobs", [0, 3])
def test_tokens_and_logprobs_come_back_in_one_copy(logprobs: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=logprobs)
    seqs = [Sequence(request_id=f"r{i}", choice_index=0, token_ids=[1, 2, 3],
                     num_prompt_tokens=3, params=params) for i in range(4)]
    batch = SamplingBatchBuilder(VOCAB, (0,), torch.device("cpu")).build(seqs, [0] * 4)
    logits = torch.randn(4, VOCAB)
    calls = _counting_tolist(monkeypatch)
    out = Sampler()(logits, batch)
    assert len(calls) == 1
    monkeypatch.undo()
    expected = logits.log_softmax(dim=-1)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.token_logprobs == expected.max(dim=-1).values.tolist()
    top = expected.topk(logprobs, dim=-1) if logprobs else None
    assert out.top_ids == (top.indices.tolist() if top else [[] for _ in range(4)])
    assert out.top_logprobs == (top.values.tolist() if top else [[] for _ in range(4)])
    assert all(type(t) is int for t in out.token_ids)


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    sent: list[list[int]] = []
    real: Callable[[torch.Tensor, torch.device], torch.Tensor] = block_copy.host_to_device

    def record(t: torch.Tensor, device: torch.device) -> torch.Tensor:
        assert t.device.type == "cpu"
        sent.append(t.tolist())
        return real(t, device)

    monkeypatch.setattr(block_copy, "host_to_device", record)
    return sent


def test_swap_and_copy_on_write_stage_their_block_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    caches = [torch.randn(2, 6, 4, 1, 8) for _ in range(2)]
    host = kv_swap.allocate_host_kv(caches, 4)
    sent = _recording(monkeypatch)
    kv_swap.copy_to_host(caches, host, [(5, 0), (2, 1)])
    kv_swap.copy_to_device(host, caches, [(0, 3)])
    block_copy.copy_blocks(caches, [(1, 4)])
    assert sent == [[5, 2], [3], [1], [4]]
    for cache in caches:
        assert torch.equal(cache[:, 3], cache[:, 5])
        assert torch.equal(cache[:, 4], cache[:, 1])
