"""What the engine thread hands the publisher (``kvrelay_worker.jobs.publisher``): a job's
event, a hand-back, an end without an event; and ``coalesce``, which merges a job's
consecutive token events per choice, so a publisher that falls behind sends fewer,
larger events instead of a growing backlog.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay.protocol import AnyEvent, Tokens, ToolCallDelta
from kvrelay_worker.jobs.active_job import ActiveJob

__all__ = ["DoneItem", "EventItem", "HandbackItem", "Item", "coalesce"]


@dataclass
class EventItem:
    job: ActiveJob
    event: AnyEvent
    # For a terminal event: the outcome to record once it is written.
    outcome: str | None = None


@dataclass
class HandbackItem:
    """Give the job back to the queue after its earlier events are written."""

    job: ActiveJob


@dataclass
class DoneItem:
    """End a job without an event (fenced: another worker owns it now)."""

    job: ActiveJob
    outcome: str


Item = EventItem | HandbackItem | DoneItem


def coalesce(items: list[Item]) -> list[Item]:
    """Merge each job's token events of one choice into one event, while no other item
    of that job comes between them.

    Whatever queued up while the previous batch was in flight arrives here together, so
    a job that got several steps' tokens meanwhile sends one event per choice, not one
    per step. Each choice's order is kept, and nothing moves across a job's other
    events (Started, the terminal one) or items; only the interleaving of one job's
    choices may change, which no reader depends on. One dict lookup per item.
    """
    out: list[Item] = []
    # Per (job, choice): its open token event, until another item of the job comes.
    open_tokens: dict[tuple[ActiveJob, int], Tokens] = {}
    # Per job: the choices it has open (to close them all at once).
    open_choices: dict[ActiveJob, list[int]] = {}
    for item in items:
        event = item.event if isinstance(item, EventItem) else None
        if isinstance(event, Tokens):
            key = (item.job, event.index)
            prev = open_tokens.get(key)
            if prev is not None and prev.finish_reason is None:
                _merge_tokens(prev, event)
                continue
            open_tokens[key] = event
            if prev is None:
                open_choices.setdefault(item.job, []).append(event.index)
        else:
            for index in open_choices.pop(item.job, ()):
                del open_tokens[(item.job, index)]
        out.append(item)
    return out


def _merge_tokens(into: Tokens, extra: Tokens) -> None:
    """Append ``extra`` to ``into`` in place (both are this batch's own events)."""
    into.token_ids.extend(extra.token_ids)
    into.text += extra.text
    if extra.reasoning:
        into.reasoning = (into.reasoning or "") + extra.reasoning
    if extra.tool_calls:
        into.tool_calls = _merge_call_pieces(into.tool_calls or [], extra.tool_calls)
    if into.prompt_logprobs is None:
        into.prompt_logprobs = extra.prompt_logprobs
    if extra.logprobs is not None:
        if into.logprobs is None:
            into.logprobs = []
        into.logprobs.extend(extra.logprobs)
    into.finish_reason = extra.finish_reason
    into.cumulative_logprob = extra.cumulative_logprob
    into.beam_score = extra.beam_score


def _merge_call_pieces(into: list[ToolCallDelta], extra: list[ToolCallDelta]
                       ) -> list[ToolCallDelta]:
    """``into`` then ``extra``, a piece that only continues the previous piece's call
    (same index, no id or name) folded into it: the same arguments, fewer pieces."""
    merged = list(into)
    for piece in extra:
        last = merged[-1] if merged else None
        if last is not None and last.index == piece.index and piece.id is None \
                and piece.name is None:
            merged[-1] = ToolCallDelta(index=last.index, id=last.id, name=last.name,
                                       arguments=last.arguments + piece.arguments)
        else:
            merged.append(piece)
    return merged
