"""kvrelay results -> OpenAI response objects (whole completions and stream chunks).

Chat: ``message.tool_calls`` (``content`` null when the model only called tools),
``message.reasoning_content``, ``finish_reason`` "tool_calls"; streamed, each call's first
piece carries its ``id``, ``type`` and ``function.name``, the next ones ``arguments``
fragments only. Completions: ``logprobs`` with ``text_offset``, and ``echo``.
"""

from __future__ import annotations

from typing import Any

from kvrelay.completion import Choice, Completion, StreamChunk
from kvrelay.gateway.echo import echo_prefix
from kvrelay.gateway.logprob_json import (
    TextOffsets,
    chat_logprobs,
    join_text_logprobs,
    text_logprobs,
)
from kvrelay.gateway.output_form import CHAT, TEXT, OutputForm
from kvrelay.protocol import PromptLogprob, ToolCall, ToolCallDelta, Usage

__all__ = ["CHAT", "TEXT", "ChunkMaker", "finish_reason", "response_id", "usage", "whole"]

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def response_id(kind: str, job_id: str) -> str:
    return f"chatcmpl-{job_id}" if kind == CHAT else f"cmpl-{job_id}"


def finish_reason(reason: str | None) -> str:
    return _FINISH.get(reason or "stop", "stop")


def usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments}}


def chat_message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["tool_calls"] = [tool_call_json(c) for c in choice.tool_calls]
        if not choice.text:
            message["content"] = None
    if choice.reasoning:
        message["reasoning_content"] = choice.reasoning
    return message


def _text_choice(form: OutputForm, choice: Choice,
                 scored: list[PromptLogprob | None] | None) -> dict[str, Any]:
    offsets = TextOffsets()
    as_ids = form.token_ids_as_names
    prefix, parts = "", []
    if form.echo is not None:
        prefix, prompt_part = echo_prefix(form.echo, scored, offsets, as_ids=as_ids)
        if prompt_part is not None:
            parts.append(prompt_part)
    if choice.logprobs is not None:
        parts.append(text_logprobs(choice.logprobs, choice.text, offsets, as_ids=as_ids))
    return {"index": choice.index, "text": prefix + choice.text,
            "logprobs": join_text_logprobs(parts) if parts else None,
            "finish_reason": finish_reason(choice.finish_reason)}


def whole(form: OutputForm, done: Completion, model: str, created: int) -> dict[str, Any]:
    """The non-streamed answer."""
    if form.kind == CHAT:
        choices = [{"index": c.index, "message": chat_message(c),
                    "logprobs": chat_logprobs(c.logprobs, form.token_ids_as_names),
                    "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
    else:
        choices = [_text_choice(form, c, done.prompt_logprobs) for c in done.choices]
    return {
        "id": response_id(form.kind, done.job_id),
        "object": "chat.completion" if form.kind == CHAT else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": done.worker,
        "choices": choices,
        "usage": usage(done.usage),
    }


class ChunkMaker:
    """Stream chunks of one response: the first delta of each chat choice names the role,
    the first piece of each tool call its id and name; a completions choice's first chunk
    starts with the echoed prompt."""

    def __init__(self, form: OutputForm, job_id: str, model: str, created: int) -> None:
        self.form = form
        self.kind = form.kind
        self.id = response_id(form.kind, job_id)
        self.model = model
        self.created = created
        self.include_usage = form.include_usage
        self._object = "chat.completion.chunk" if form.kind == CHAT else "text_completion"
        self._begun: set[int] = set()
        self._calls: set[tuple[int, int]] = set()
        self._offsets: dict[int, TextOffsets] = {}
        self._scored: list[PromptLogprob | None] | None = None

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": self._object, "created": self.created,
                               "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def _call_piece(self, choice: int, delta: ToolCallDelta) -> dict[str, Any]:
        piece: dict[str, Any] = {"index": delta.index}
        if (choice, delta.index) in self._calls:
            piece["function"] = {"arguments": delta.arguments}
            return piece
        self._calls.add((choice, delta.index))
        piece["id"] = delta.id or f"call_{delta.index}"  # as CompletionBuilder names it
        piece["type"] = "function"
        piece["function"] = {"name": delta.name or "", "arguments": delta.arguments}
        return piece

    def _chat_delta(self, chunk: StreamChunk) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if chunk.index not in self._begun:
            self._begun.add(chunk.index)
            delta["role"] = "assistant"
        if chunk.text or not (chunk.reasoning or chunk.tool_calls):
            delta["content"] = chunk.text
        if chunk.reasoning:
            delta["reasoning_content"] = chunk.reasoning
        if chunk.tool_calls:
            delta["tool_calls"] = [self._call_piece(chunk.index, d) for d in chunk.tool_calls]
        return delta

    def _text_piece(self, index: int, text: str,
                    logprobs: list[Any] | None) -> tuple[str, dict[str, list[Any]] | None]:
        """A completions choice's text and logprobs, the echoed prompt first if due."""
        offsets = self._offsets.setdefault(index, TextOffsets())
        parts = []
        prefix = ""
        if self.form.echo is not None and index not in self._begun:
            prefix, prompt_part = echo_prefix(self.form.echo, self._scored, offsets,
                                              as_ids=self.form.token_ids_as_names)
            if prompt_part is not None:
                parts.append(prompt_part)
        self._begun.add(index)
        if logprobs is not None:
            parts.append(text_logprobs(logprobs, text, offsets,
                                       as_ids=self.form.token_ids_as_names))
        return prefix + text, join_text_logprobs(parts) if parts else None

    def tokens(self, chunk: StreamChunk) -> dict[str, Any]:
        if chunk.prompt_logprobs is not None:
            self._scored = chunk.prompt_logprobs
        if self.kind == CHAT:
            choice = {"index": chunk.index, "delta": self._chat_delta(chunk),
                      "logprobs": chat_logprobs(chunk.logprobs, self.form.token_ids_as_names),
                      "finish_reason": None}
        else:
            text, logprobs = self._text_piece(chunk.index, chunk.text, chunk.logprobs)
            choice = {"index": chunk.index, "text": text, "logprobs": logprobs,
                      "finish_reason": None}
        return self._envelope([choice])

    def finish(self, done: Completion) -> dict[str, Any]:
        """One chunk closing every choice (and carrying the usage when asked for); a
        choice that sent no tokens (``max_tokens`` 0) gets its echoed prompt here."""
        choices: list[dict[str, Any]]
        if self.kind == CHAT:
            choices = [{"index": c.index, "delta": {}, "logprobs": None,
                        "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
        else:
            choices = []
            for c in done.choices:
                text, logprobs = "", None
                if self.form.echo is not None and c.index not in self._begun:
                    text, logprobs = self._text_piece(c.index, "", None)
                choices.append({"index": c.index, "text": text, "logprobs": logprobs,
                                "finish_reason": finish_reason(c.finish_reason)})
        out = self._envelope(choices)
        out["system_fingerprint"] = done.worker
        if self.include_usage:
            out["usage"] = usage(done.usage)
        return out
