"""How a choice's detokenizer and output parsers are made, resumed and read.

``InputProcessor`` builds each choice with ``choice_output``; ``ChoiceState`` reads its
text through ``split`` and ``whole`` whether or not the choice has parsers, so the
request state needs no branch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.tools.detect import prompt_opens_reasoning
from kvrelay_worker.engine.tools.marker_tokens import kept_marker_ids, markers_for
from kvrelay_worker.engine.tools.output_parsing import (
    OutputParsing,
    ParsedDelta,
    output_parsing_for,
)

# Prompt tokens decoded to see whether the generation prompt left ``<think>`` open.
_PROMPT_TAIL_TOKENS = 8


def choice_output(tokenizer: Any, params: SamplingParams, request_id: str,
                  choice_index: int, prompt_ids: Seq[int], *, watch_stops: bool = True
                  ) -> tuple[IncrementalDetokenizer, OutputParsing | None]:
    """A choice's detokenizer and, when its request asks for them, its parsers
    (``watch_stops`` False: the tokens are final, stop strings were already applied)."""
    opens = False
    if params.reasoning_parser is not None and prompt_ids:
        tail = tokenizer.decode(list(prompt_ids[-_PROMPT_TAIL_TOKENS:]),
                                skip_special_tokens=False)
        opens = prompt_opens_reasoning(tail)
    parsing = output_parsing_for(params.tool_plan, params.reasoning_parser, request_id,
                                 choice_index, prompt_opens_reasoning=opens)
    keep: frozenset[int] = frozenset()
    if parsing is not None:
        keep = kept_marker_ids(tokenizer, markers_for(params.tool_plan,
                                                      params.reasoning_parser))
    detok = IncrementalDetokenizer(tokenizer, prompt_ids,
                                   params.stop_strings if watch_stops else (),
                                   params.skip_special_tokens,
                                   params.min_tokens if watch_stops else 0,
                                   keep_special_ids=keep)
    return detok, parsing


def resume_choice_output(detok: IncrementalDetokenizer, parsing: OutputParsing | None,
                         tokens: Seq[int], sent_text: str, sent_reasoning: str,
                         sent_calls: Seq[ToolCallDelta]) -> None:
    """Replay the tokens an earlier attempt produced; what it sent is not sent again.

    Without parsers the detokenizer alone resumes. With them, the raw text the earlier
    attempt had parsed (all but what the detokenizer still holds back) is parsed again.
    """
    if parsing is None:
        detok.resume(tokens, sent_text)
        return
    for token_id in tokens:
        detok.add_token(token_id)
    parsing.resume(detok.take_delta(False), sent_text, sent_reasoning, sent_calls)


def split(detok: IncrementalDetokenizer, parsing: OutputParsing | None,
          finished: bool) -> ParsedDelta:
    """The choice's news: its new text, split by the parsers when it has them."""
    text = detok.take_delta(finished)
    return ParsedDelta(text) if parsing is None else parsing.feed(text, finished)


def whole(detok: IncrementalDetokenizer, parsing: OutputParsing | None) -> ParsedDelta:
    """The finished choice whole: all its text, reasoning and calls (each call one
    piece with its id, name and arguments)."""
    detok.flush()
    rest = detok.take_delta(True)
    if parsing is None:
        return ParsedDelta(detok.text)
    parsing.feed(rest, True)
    calls = [ToolCallDelta(index=i, id=c.id, name=c.function.name,
                           arguments=c.function.arguments)
             for i, c in enumerate(parsing.tool_calls)]
    return ParsedDelta(parsing.text, parsing.reasoning, calls)


def reported_reason(parsing: OutputParsing | None, reason: str | None) -> str | None:
    return reason if parsing is None else parsing.finish_reason(reason)
