"""What a job's log says was sent, read back for the next attempt: per choice, the tokens,
text, reasoning and tool-call pieces, in the order the events carried them."""

from __future__ import annotations

from kvrelay.protocol import (
    AnyEvent,
    Finished,
    Started,
    Timings,
    Tokens,
    ToolCallDelta,
    Usage,
)
from kvrelay_worker.engine import SamplingParams
from kvrelay_worker.jobs.job_store import progress_from_events
from kvrelay_worker.jobs.prior_replay import ReplayPlan


def test_reasoning_and_call_pieces_are_carried_per_choice() -> None:
    events: list[AnyEvent] = [
        Started(seq=0, worker="w:1", attempt=1),
        Tokens(seq=1, index=0, token_ids=[1, 2], text="", reasoning="Think"),
        Tokens(seq=2, index=1, token_ids=[3], text="Hi"),
        Tokens(seq=3, index=0, token_ids=[4], text="", reasoning="ing.",
               tool_calls=[ToolCallDelta(index=0, id="call_a", name="f", arguments='{"x"')]),
        Tokens(seq=4, index=0, token_ids=[5], text="",
               tool_calls=[ToolCallDelta(index=0, arguments=": 1}"),
                           ToolCallDelta(index=1, id="call_b", name="g")]),
    ]
    plan = ReplayPlan.of(SamplingParams(n=2, max_tokens=9), progress_from_events(events))
    assert plan.outputs == [[1, 2, 4, 5], [3]]
    assert plan.texts == ["", "Hi"]
    assert plan.reasoning == ["Thinking.", ""]
    assert plan.tool_calls == [[
        ToolCallDelta(index=0, id="call_a", name="f", arguments='{"x"'),
        ToolCallDelta(index=0, arguments=": 1}"),
        ToolCallDelta(index=1, id="call_b", name="g")], []]


def test_a_job_that_sent_nothing_starts_clean() -> None:
    done = Finished(seq=1, finish_reason="tool_calls", finish_reasons=["tool_calls"],
                    usage=Usage(prompt_tokens=1, completion_tokens=0),
                    timings=Timings(queue=0, ttft=0, decode=0, total=0))
    plan = ReplayPlan.of(SamplingParams(max_tokens=9),
                         progress_from_events([Started(seq=0, worker="w:1", attempt=1), done]))
    assert (plan.outputs, plan.reasoning, plan.tool_calls) == (None, None, None)
