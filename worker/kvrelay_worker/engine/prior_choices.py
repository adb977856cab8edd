"""What an earlier attempt of a request already reported, per choice (failover resume)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from kvrelay_worker.engine.errors import InvalidPromptError
from kvrelay_worker.engine.sched.sequence import SequenceStatus

# What a prior finish reason may say: the finished statuses' values.
_FINISH_REASONS = frozenset(s.value for s in SequenceStatus if s.finished)


@dataclass
class PriorChoices:
    """Per choice: tokens and text already sent, and a finish reason if it had ended.

    Choices past the end of a list have no prior tokens, text or reason.
    """

    outputs: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)

    @classmethod
    def checked(cls, outputs: Seq[Seq[int]] | None, texts: Seq[str] | None,
                finish_reasons: Seq[str | None] | None, vocab_size: int) -> PriorChoices:
        """The progress, after checking its tokens and reasons (``InvalidPromptError``)."""
        prior = cls([list(p) for p in outputs or ()], list(texts or ()),
                    list(finish_reasons or ()))
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
                and all(r is None for r in self.finish_reasons))

    def tokens(self, index: int) -> list[int]:
        return self.outputs[index] if index < len(self.outputs) else []

    def text(self, index: int) -> str:
        return self.texts[index] if index < len(self.texts) else ""

    def finish_reason(self, index: int) -> str | None:
        return self.finish_reasons[index] if index < len(self.finish_reasons) else None
