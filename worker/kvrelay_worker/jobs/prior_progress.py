"""What a claim finds of earlier attempts: their progress, read back from the job's log."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvrelay.protocol import TERMINAL_EVENTS, AnyEvent, Tokens, ToolCallDelta


@dataclass
class Claim:
    """Outcome of trying to take a job: ``claimed`` (with the attempt and what earlier
    attempts reported), ``owned``, ``aborted``, ``done`` or ``reused``."""

    status: str
    attempt: int = 0
    progress: PriorProgress | None = None


@dataclass
class PriorProgress:
    """What earlier attempts already reported, read back from the job's event log."""

    next_seq: int = 0
    terminal: bool = False
    tokens: dict[int, list[int]] = field(default_factory=dict)
    texts: dict[int, list[str]] = field(default_factory=dict)
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # With output parsers: the reasoning text and tool-call pieces sent, per choice.
    reasoning: dict[int, list[str]] = field(default_factory=dict)
    tool_calls: dict[int, list[ToolCallDelta]] = field(default_factory=dict)
    # (last seq, bytes) of every entry, oldest first: where the log's byte cap stands.
    entry_sizes: list[tuple[int, int]] = field(default_factory=list)
    # The seq of the log's first event (None: the log is empty).
    first_seq: int | None = None

    @property
    def truncated(self) -> bool:
        """The log no longer starts at seq 0 (trimmed): the job cannot be continued."""
        return self.first_seq not in (None, 0)

    @property
    def has_tokens(self) -> bool:
        return any(self.tokens.values())

    def choice_tokens(self, n: int) -> list[list[int]]:
        return [self.tokens.get(i, []) for i in range(n)]

    def choice_texts(self, n: int) -> list[str]:
        return ["".join(self.texts.get(i, [])) for i in range(n)]

    def choice_finish_reasons(self, n: int) -> list[str | None]:
        return [self.finish_reasons.get(i) for i in range(n)]

    def choice_reasoning(self, n: int) -> list[str]:
        return ["".join(self.reasoning.get(i, [])) for i in range(n)]

    def choice_tool_calls(self, n: int) -> list[list[ToolCallDelta]]:
        return [self.tool_calls.get(i, []) for i in range(n)]


def progress_from_events(events: list[AnyEvent]) -> PriorProgress:
    progress = PriorProgress()
    for event in events:
        if progress.first_seq is None:
            progress.first_seq = event.seq
        progress.next_seq = max(progress.next_seq, event.seq + 1)
        if isinstance(event, Tokens):
            progress.tokens.setdefault(event.index, []).extend(event.token_ids)
            progress.texts.setdefault(event.index, []).append(event.text)
            if event.reasoning:
                progress.reasoning.setdefault(event.index, []).append(event.reasoning)
            if event.tool_calls:
                progress.tool_calls.setdefault(event.index, []).extend(event.tool_calls)
            if event.finish_reason:
                progress.finish_reasons[event.index] = event.finish_reason
        elif isinstance(event, TERMINAL_EVENTS):
            progress.terminal = True
    return progress
