"""Incremental detokenisation with stop strings.

Text is produced token by token so streams can show it at once, with three promises:
the deltas concatenate to the decode of the whole output; a character split across
tokens (multi-byte UTF-8) is held until it is complete, never shown broken; and a stop
string never reaches the caller, not even partly: text that might be the start of a stop
string is held back until the next tokens decide. Stop strings are matched by one
automaton that reads each new character once (``stop_matcher``), so a step costs
O(new text) however many stop strings a request brings.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from kvrelay_worker.engine.sample.stop_matcher import ROOT, stop_matcher
from kvrelay_worker.engine.tools.marker_tokens import special_token_ids

_INCOMPLETE = "\ufffd"
# Prompt tokens decoded in front of the output, so tokenizers that drop a word's leading
# space at the start of a decode (SentencePiece) still produce it for the first output.
_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Decodes one choice's output tokens as they arrive and watches for stop strings."""

    def __init__(self, tokenizer: Any, prompt_token_ids: Seq[int], stop: Seq[str] = (),
                 skip_special_tokens: bool = True, min_tokens: int = 0,
                 keep_special_ids: frozenset[int] = frozenset()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.skip_special_tokens = skip_special_tokens
        # Special tokens shown although the others are skipped (tool-call markers the
        # output parsers read, ``engine/tools/marker_tokens.py``): the rest are dropped
        # before decoding, so an EOS never reaches the text.
        self._dropped_ids: frozenset[int] | None = None
        if skip_special_tokens and keep_special_ids:
            self._dropped_ids = special_token_ids(tokenizer) - keep_special_ids
        # Stop strings count only from the min_tokens-th output token on, as stop tokens
        # and EOS do: cutting the text earlier would end it while generation goes on.
        self.min_tokens = min_tokens
        self._num_output = 0
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.text = ""
        self._emitted = 0
        self.stopped = False
        self._matcher = stop_matcher(self.stop) if self.stop else None
        self._stop_state = ROOT

    def _decode(self, ids: list[int]) -> str:
        if self._dropped_ids is not None:
            kept = [i for i in ids if i not in self._dropped_ids]
            shown: str = self.tokenizer.decode(kept, skip_special_tokens=False)
            return shown
        text: str = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return text

    def add_token(self, token_id: int) -> bool:
        """Account for one more output token; return True if it completed a stop string."""
        if self.stopped:
            return True
        self._ids.append(token_id)
        self._num_output += 1
        new_text = self._advance(final=False)
        if new_text:
            self._append(new_text)
        return self.stopped

    def _advance(self, final: bool) -> str:
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if not final and (len(full) <= len(prefix) or full.endswith(_INCOMPLETE)):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def _append(self, new_text: str) -> None:
        start = len(self.text)
        self.text += new_text
        if self._matcher is None:
            return
        # Only the new text is read: the automaton's state stands for the tail before it.
        scanned = self._matcher.scan(self._stop_state, new_text)
        self._stop_state = scanned.state
        if scanned.match_start is not None and self._num_output >= self.min_tokens:
            self.text = self.text[: start + scanned.match_start]
            self.stopped = True

    def flush(self) -> None:
        """Decode whatever is still pending (call once, when the choice finishes)."""
        if not self.stopped and self._read_offset < len(self._ids):
            new_text = self._advance(final=True)
            if new_text:
                self._append(new_text)

    def _holdback(self) -> int:
        """Length of the longest tail of ``text`` that could begin a stop string."""
        if self.stopped or self._matcher is None:
            return 0
        return self._matcher.pending(self._stop_state)

    def take_delta(self, finished: bool) -> str:
        """Text not yet handed out (all of it once the choice is finished)."""
        end = len(self.text) if finished else len(self.text) - self._holdback()
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def resume(self, prior_output_ids: Seq[int], prior_text: str) -> None:
        """Replay tokens an earlier attempt produced; ``prior_text`` was already emitted."""
        for token_id in prior_output_ids:
            self.add_token(token_id)
        if self.text.startswith(prior_text):
            self._emitted = len(prior_text)
        else:
            self._emitted = min(len(prior_text), len(self.text))
