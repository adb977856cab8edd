"""What the output parsers found in a choice's text, kept so each event sends only news.

Every part (answer text, reasoning, each call's arguments) is a ``TextChannel``: the
parsers append, an event takes what was not sent yet. A resumed attempt replays the
parsers over the earlier tokens and marks as sent what the earlier attempt sent, so its
first event continues exactly where the log stopped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvrelay.protocol import FunctionCall, ToolCall, ToolCallDelta

_WHITESPACE = " \t\n\r"


class TextChannel:
    """Text appended in pieces; ``take`` returns the part not sent yet."""

    __slots__ = ("_all", "_pending", "_skip")

    def __init__(self) -> None:
        self._all: list[str] = []
        self._pending: list[str] = []
        self._skip = 0  # characters an earlier attempt already sent

    def append(self, text: str) -> None:
        if text:
            self._all.append(text)
            self._pending.append(text)

    def take(self) -> str:
        text = "".join(self._pending)
        self._pending.clear()
        cut = min(self._skip, len(text))
        self._skip -= cut
        return text[cut:]

    def mark_sent(self, count: int) -> None:
        """The first ``count`` characters were sent by an earlier attempt (a resume
        calls this before the first ``take``)."""
        self._skip = count

    def text(self) -> str:
        return "".join(self._all)


@dataclass
class ParsedCall:
    """One call: its deterministic id, its name, its arguments as they stream."""

    id: str
    name: str
    arguments: TextChannel = field(default_factory=TextChannel)
    header_sent: bool = False

    def delta(self, index: int) -> ToolCallDelta | None:
        """The news of this call as one delta, or None."""
        arguments = self.arguments.take()
        if self.header_sent and not arguments:
            return None
        delta = ToolCallDelta(index=index, arguments=arguments)
        if not self.header_sent:
            delta.id, delta.name = self.id, self.name
            self.header_sent = True
        return delta

    def whole(self) -> ToolCall:
        return ToolCall(id=self.id, function=FunctionCall(name=self.name,
                                                          arguments=self.arguments.text()))


class ParsedOutput:
    """The sink the parsers write to: answer text, reasoning, calls."""

    def __init__(self, call_id: CallIds) -> None:
        self.content = TextChannel()
        self.reasoning = TextChannel()
        self.calls: list[ParsedCall] = []
        self._call_id = call_id
        self._held_space = ""  # answer whitespace waiting to see what follows it
        # Per call index: (header sent, argument characters sent) by an earlier attempt.
        self._sent_before: dict[int, tuple[bool, int]] = {}

    # ------------------------------------------------------------- for the parsers

    def add_content(self, text: str) -> None:
        """Answer text. Whitespace is held until text follows: whitespace before a call
        or after the last one is layout, not answer."""
        if not text:
            return
        body = text.rstrip(_WHITESPACE)
        if body:
            self.content.append(self._held_space + body)
            self._held_space = ""
        self._held_space += text[len(body):]

    def end_content(self) -> None:
        """The answer is over: held whitespace is answer text unless calls were made."""
        if self._held_space and not self.calls:
            self.content.append(self._held_space)
        self._held_space = ""

    def open_call(self, name: str) -> None:
        self._held_space = ""
        call = ParsedCall(id=self._call_id(len(self.calls)), name=name)
        header_sent, arguments_sent = self._sent_before.pop(len(self.calls), (False, 0))
        call.header_sent = header_sent
        call.arguments.mark_sent(arguments_sent)
        self.calls.append(call)

    def add_arguments(self, text: str) -> None:
        if text:
            self.calls[-1].arguments.append(text)

    # ------------------------------------------------------------- for the events

    def mark_calls_sent(self, deltas: Iterable[ToolCallDelta]) -> None:
        """An earlier attempt sent these call pieces: they are not sent again (calls
        the replay has not reached yet are marked when they open)."""
        for index, (header, length) in _sent_per_call(deltas).items():
            if index < len(self.calls):
                call = self.calls[index]
                call.header_sent = header
                call.arguments.mark_sent(length)
            else:
                self._sent_before[index] = (header, length)

    def take_calls(self) -> list[ToolCallDelta]:
        deltas = []
        for index, call in enumerate(self.calls):
            delta = call.delta(index)
            if delta is not None:
                deltas.append(delta)
        return deltas


def _sent_per_call(deltas: Iterable[ToolCallDelta]) -> dict[int, tuple[bool, int]]:
    sent: dict[int, tuple[bool, int]] = {}
    for delta in deltas:
        header, length = sent.get(delta.index, (False, 0))
        sent[delta.index] = (header or delta.name is not None, length + len(delta.arguments))
    return sent


class CallIds:
    """Call ids that depend only on the request, the choice and the call's place, so a
    resumed or taken-over job names its calls as the first attempt did."""

    def __init__(self, request_id: str, choice_index: int) -> None:
        self.request_id = request_id
        self.choice_index = choice_index

    def __call__(self, call_index: int) -> str:
        return tool_call_id(self.request_id, self.choice_index, call_index)


def tool_call_id(request_id: str, choice_index: int, call_index: int) -> str:
    digest = hashlib.sha256(f"{request_id}\0{choice_index}\0{call_index}".encode())
    return "call_" + digest.hexdigest()[:24]
