"""What an earlier attempt of a request already reported, per choice (failover resume)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.errors import InvalidPromptError
from kvrelay_worker.engine.sched.sequence import SequenceStatus

# What a prior finish reason may say: the finished statuses' values, and "tool_calls"
# (a normal stop whose output was tool calls).
_FINISH_REASONS = frozenset(s.value for s in SequenceStatus if s.finished) | {"tool_calls"}


def status_of_reason(reason: str) -> SequenceStatus:
    """The sequence status of a reported finish reason ("tool_calls" stopped normally)."""
    return SequenceStatus.FINISHED_STOPPED if reason == "tool_calls" else SequenceStatus(reason)


@dataclass
class PriorChoices:
    """Per choice: tokens and text already sent, and a finish reason if it had ended;
    with output parsers, the reasoning text and tool-call pieces sent too.

    Choices past the end of a list have no prior tokens, text or reason.
    """

    outputs: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    reasonings: list[str] = field(default_factory=list)
    tool_calls: list[list[ToolCallDelta]] = field(default_factory=list)

    @classmethod
    def checked(cls, outputs: Seq[Seq[int]] | None, texts: Seq[str] | None,
                finish_reasons: Seq[str | None] | None, vocab_size: int, *,
                reasonings: Seq[str] | None = None,
                tool_calls: Seq[Seq[ToolCallDelta]] | None = None) -> PriorChoices:
        """The progress, after checking its tokens and reasons (``InvalidPromptError``)."""
        prior = cls([list(p) for p in outputs or ()], list(texts or ()),
                    list(finish_reasons or ()), list(reasonings or ()),
                    [list(c) for c in tool_calls or ()])
        for tokens in prior.outputs:
            if any(not 0 <= t < vocab_size for t in tokens):
                raise InvalidPromptError("prior output has a token outside the vocabulary")
        for reason in prior.finish_reasons:
            if reason is not None and reason not in _FINISH_REASONS:
                raise InvalidPromptError(
                    f"prior finish reason {reason!r} is not one of {sorted(_FINISH_REASONS)}")
        return prior

    @property
    def is_empty(self) -> bool:
        """Nothing was reported before: no tokens, no text, no finished choice."""
        return (not any(self.outputs) and not any(self.texts)
                and not any(self.reasonings) and not any(self.tool_calls)
                and all(r is None for r in self.finish_reasons))

    def tokens(self, index: int) -> list[int]:
        return self.outputs[index] if index < len(self.outputs) else []

    def text(self, index: int) -> str:
        return self.texts[index] if index < len(self.texts) else ""

    def finish_reason(self, index: int) -> str | None:
        return self.finish_reasons[index] if index < len(self.finish_reasons) else None

    def reasoning(self, index: int) -> str:
        return self.reasonings[index] if index < len(self.reasonings) else ""

    def calls(self, index: int) -> list[ToolCallDelta]:
        return self.tool_calls[index] if index < len(self.tool_calls) else []
