"""A choice's output run through the worker's real detokenizer and parsers, as a stream.

``stream_tokens`` feeds token ids the way the engine does (one step's tokens at a time,
the detokenizer's text delta handed to the parsers each step) and assembles what the
events would carry, as the SDK's ``CompletionBuilder`` does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.tools.choice_parsing import choice_output, reported_reason, split


@dataclass
class Streamed:
    """What a client assembles from the events: text, reasoning, calls, finish reason."""

    text: str = ""
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    deltas: list[ToolCallDelta] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, text: str, reasoning: str, calls: Sequence[ToolCallDelta]) -> None:
        self.text += text
        self.reasoning += reasoning
        for delta in calls:
            self.deltas.append(delta)
            call = self.calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            assert (delta.id is None) == (delta.name is None), "id and name come together"
            if delta.id is not None:
                assert not call["id"], "a call's id and name are sent once"
                call["id"], call["name"] = delta.id, delta.name or ""
            else:
                assert call["id"], "arguments before the call's id"
            call["arguments"] += delta.arguments

    def named_arguments(self) -> list[tuple[str, str]]:
        return [(c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]


def stream_tokens(tokenizer: Any, params: SamplingParams, output_ids: Sequence[int],
                  steps: Sequence[int] | None = None, prompt_ids: Sequence[int] = (),
                  request_id: str = "req-1", reason: str = "stop") -> Streamed:
    """Stream ``output_ids`` in steps of the given sizes (default: one token a step)."""
    detok, parsing = choice_output(tokenizer, params, request_id, 0, list(prompt_ids))
    sizes = list(steps) if steps is not None else [1] * len(output_ids)
    assert sum(sizes) == len(output_ids)
    streamed = Streamed()
    at = 0
    for size in sizes:
        for token in output_ids[at:at + size]:
            detok.add_token(token)
        at += size
        part = split(detok, parsing, finished=False)
        streamed.add(part.text, part.reasoning, part.tool_calls)
    detok.flush()
    last = split(detok, parsing, finished=True)
    streamed.add(last.text, last.reasoning, last.tool_calls)
    streamed.finish_reason = reported_reason(parsing, reason)
    return streamed


def random_steps(count: int, seed: int, most: int = 6) -> list[int]:
    """``count`` tokens cut into random steps of 1..``most`` tokens."""
    rng = random.Random(seed)
    steps = []
    while count:
        steps.append(min(count, rng.randint(1, most)))
        count -= steps[-1]
    return steps
