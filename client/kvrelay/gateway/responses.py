"""kvrelay results -> OpenAI response objects (whole completions and stream chunks).

The gateway has no tokenizer, so a logprob's token is named ``token_id:<id>`` (vLLM's
convention for token ids as tokens) and its ``bytes`` are null.
"""

from __future__ import annotations

from typing import Any

from kvrelay.completion import Completion, StreamChunk
from kvrelay.protocol import TokenLogprob, Usage

CHAT = "chat"
TEXT = "text"

_FINISH = {"stop": "stop", "length": "length"}


def response_id(kind: str, job_id: str) -> str:
    return f"chatcmpl-{job_id}" if kind == CHAT else f"cmpl-{job_id}"


def finish_reason(reason: str | None) -> str:
    return _FINISH.get(reason or "stop", "stop")


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


def usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def chat_logprobs(items: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if items is None:
        return None
    return {"content": [
        {"token": token_name(t.token_id), "logprob": t.logprob, "bytes": None,
         "top_logprobs": [{"token": token_name(a.token_id), "logprob": a.logprob,
                           "bytes": None} for a in t.top]}
        for t in items
    ]}


def text_logprobs(items: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if items is None:
        return None
    return {
        "tokens": [token_name(t.token_id) for t in items],
        "token_logprobs": [t.logprob for t in items],
        "top_logprobs": [{token_name(a.token_id): a.logprob for a in t.top} for t in items],
    }


def whole(kind: str, done: Completion, model: str, created: int) -> dict[str, Any]:
    """The non-streamed answer."""
    if kind == CHAT:
        choices = [{"index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": chat_logprobs(c.logprobs),
                    "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
    else:
        choices = [{"index": c.index, "text": c.text, "logprobs": text_logprobs(c.logprobs),
                    "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
    return {
        "id": response_id(kind, done.job_id),
        "object": "chat.completion" if kind == CHAT else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": done.worker,
        "choices": choices,
        "usage": usage(done.usage),
    }


class ChunkMaker:
    """Stream chunks of one response; the first delta of each chat choice names the role."""

    def __init__(self, kind: str, job_id: str, model: str, created: int,
                 include_usage: bool) -> None:
        self.kind = kind
        self.id = response_id(kind, job_id)
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self._object = "chat.completion.chunk" if kind == CHAT else "text_completion"
        self._roled: set[int] = set()

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": self._object, "created": self.created,
                               "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def tokens(self, chunk: StreamChunk) -> dict[str, Any]:
        if self.kind == CHAT:
            delta: dict[str, Any] = {"content": chunk.text}
            if chunk.index not in self._roled:
                self._roled.add(chunk.index)
                delta = {"role": "assistant", "content": chunk.text}
            choice = {"index": chunk.index, "delta": delta,
                      "logprobs": chat_logprobs(chunk.logprobs), "finish_reason": None}
        else:
            choice = {"index": chunk.index, "text": chunk.text,
                      "logprobs": text_logprobs(chunk.logprobs), "finish_reason": None}
        return self._envelope([choice])

    def finish(self, done: Completion) -> dict[str, Any]:
        """One chunk closing every choice (and carrying the usage when asked for)."""
        choices: list[dict[str, Any]]
        if self.kind == CHAT:
            choices = [{"index": c.index, "delta": {}, "logprobs": None,
                        "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
        else:
            choices = [{"index": c.index, "text": "", "logprobs": None,
                        "finish_reason": finish_reason(c.finish_reason)} for c in done.choices]
        out = self._envelope(choices)
        out["system_fingerprint"] = done.worker
        if self.include_usage:
            out["usage"] = usage(done.usage)
        return out
