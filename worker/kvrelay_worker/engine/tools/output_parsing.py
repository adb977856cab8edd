"""A choice's output parsers, wired: reasoning first, then tool calls, then the news.

The detokenizer's text deltas go through the reasoning parser (its answer part through
the tool-call parser); each step's news is the text, reasoning and call pieces not sent
yet. The parsers' results depend only on the text they were given, never on how it was
cut into deltas, so a resumed attempt that replays them over the earlier tokens stands
exactly where the earlier attempt stood, and marks that much as sent.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from kvrelay.protocol import ToolCall, ToolCallDelta
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.tools.forced import NamedCallParser, RequiredCallsParser
from kvrelay_worker.engine.tools.hermes import HermesParser
from kvrelay_worker.engine.tools.llama3_json import Llama3JsonParser
from kvrelay_worker.engine.tools.mistral import MistralParser
from kvrelay_worker.engine.tools.parsed_output import CallIds, ParsedOutput
from kvrelay_worker.engine.tools.plan import ToolPlan
from kvrelay_worker.engine.tools.think import ThinkParser

# Finish reasons a call does not override: the output was cut (its last call may be
# incomplete, as OpenAI reports it) or abandoned.
_KEPT_REASONS = frozenset({"length", "abort"})


class ToolCallParser(Protocol):
    def feed(self, text: str, out: ParsedOutput) -> None: ...

    def finish(self, out: ParsedOutput) -> None: ...


@dataclass
class ParsedDelta:
    """One step's news of a choice, split: answer text, reasoning, call pieces."""

    text: str
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class OutputParsing:
    """Runs one choice's parsers over its text (see the module's docstring)."""

    def __init__(self, call_ids: CallIds, reasoning: ThinkParser | None,
                 tools: ToolCallParser | None, forced: bool) -> None:
        self.out = ParsedOutput(call_ids)
        self._reasoning = reasoning
        self._tools = tools
        self._forced = forced
        self._finished = False

    def feed(self, text: str, final: bool) -> ParsedDelta:
        """Parse ``text`` (the choice's next raw text) and return what is news now."""
        self._parse(text, final)
        return ParsedDelta(text=self.out.content.take(), reasoning=self.out.reasoning.take(),
                           tool_calls=self.out.take_calls())

    def _parse(self, text: str, final: bool) -> None:
        if self._finished:
            return
        answer = text
        if self._reasoning is not None:
            answer = self._reasoning.feed(text, self.out)
            if final:
                answer += self._reasoning.finish(self.out)
        if self._tools is None:
            self.out.content.append(answer)
        else:
            self._tools.feed(answer, self.out)
            if final:
                self._tools.finish(self.out)
        self._finished = final

    def finish_reason(self, reason: str | None) -> str | None:
        """The reason to report: "tool_calls" when the output is calls and ended
        normally (always with a named or required tool choice)."""
        if reason is None or reason in _KEPT_REASONS:
            return reason
        return "tool_calls" if self._forced or self.out.calls else reason

    def resume(self, text: str, sent_text: str, sent_reasoning: str,
               sent_calls: Seq[ToolCallDelta]) -> None:
        """Replay an earlier attempt's raw ``text``; what it sent is not sent again."""
        self._parse(text, final=False)
        self.out.content.mark_sent(len(sent_text))
        self.out.reasoning.mark_sent(len(sent_reasoning))
        self.out.mark_calls_sent(sent_calls)

    # ------------------------------------------------------------ whole choice

    @property
    def text(self) -> str:
        return self.out.content.text()

    @property
    def reasoning(self) -> str:
        return self.out.reasoning.text()

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [call.whole() for call in self.out.calls]


def output_parsing_for(tool_plan: ToolPlan | None, reasoning_parser: str | None,
                       request_id: str, choice_index: int, *,
                       prompt_opens_reasoning: bool = False) -> OutputParsing | None:
    """The parsers a choice's output needs, or None when it is plain text
    (``SamplingParamsError`` for a format no parser reads)."""
    reasoning = None
    if reasoning_parser is not None:
        if reasoning_parser != "think":
            raise SamplingParamsError(f"unknown reasoning parser {reasoning_parser!r}")
        reasoning = ThinkParser(starts_inside=prompt_opens_reasoning)
    tools = tool_parser_for(tool_plan)
    if reasoning is None and tools is None:
        return None
    forced = tool_plan is not None and tool_plan.mode in ("named", "required")
    return OutputParsing(CallIds(request_id, choice_index), reasoning, tools, forced)


def tool_parser_for(plan: ToolPlan | None) -> ToolCallParser | None:
    """The call parser of a tool plan: the forced shapes, or the model's own format."""
    if plan is None or plan.mode == "none":
        return None
    if plan.mode == "named":
        if plan.named is None:
            raise SamplingParamsError("a named tool plan must name its function")
        return NamedCallParser(plan.named)
    names = frozenset(t.function.name for t in plan.tools) or None
    if plan.mode == "required":
        return RequiredCallsParser(names)
    if plan.format is None:
        return None
    parser = _FORMAT_PARSERS.get(plan.format)
    if parser is None:
        raise SamplingParamsError(f"unknown tool-call format {plan.format!r}")
    return parser(names)


_FORMAT_PARSERS: dict[str, type[HermesParser] | type[Llama3JsonParser] | type[MistralParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
