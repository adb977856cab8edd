"""A job's chunks as Responses output items, and the stream events that build them.

Items open in the order their first piece arrives (reasoning, message text, each tool
call) and close when another kind starts or the answer ends; text that is only
whitespace opens no message item of its own (a template's newline between calls), unless
the answer has nothing else. Streamed and whole answers are built by this one class, so
the two always agree.
"""

from __future__ import annotations

from typing import Any, TypeVar

from kvrelay.completion import StreamChunk
from kvrelay.protocol import TokenLogprob, ToolCallDelta

Event = dict[str, Any]


def _token(t: TokenLogprob | Any) -> str:
    token: str | None = t.token
    return token if token is not None else f"token_id:{t.token_id}"


def _bytes(t: TokenLogprob | Any) -> list[int]:
    return list(t.token_bytes) if t.token_bytes is not None else []


def delta_logprobs(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Log-probabilities as a text delta event carries them."""
    return [{"token": _token(t), "logprob": t.logprob,
             "top_logprobs": [{"token": _token(a), "logprob": a.logprob} for a in t.top]}
            for t in items]


def part_logprobs(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Log-probabilities as an ``output_text`` part carries them (with bytes)."""
    return [{"token": _token(t), "bytes": _bytes(t), "logprob": t.logprob,
             "top_logprobs": [{"token": _token(a), "bytes": _bytes(a), "logprob": a.logprob}
                              for a in t.top]}
            for t in items]


class _Item:
    """One output item being built; ``done`` is its final form."""

    kind = ""

    def __init__(self, item_id: str, index: int) -> None:
        self.id = item_id
        self.index = index
        self.final: dict[str, Any] | None = None

    def ref(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.index}

    def opening(self) -> list[Event]:
        raise NotImplementedError

    def finished(self, status: str) -> dict[str, Any]:
        """The item as it stands, marked ``status``."""
        raise NotImplementedError

    def closing(self, status: str) -> list[Event]:
        raise NotImplementedError


class _Message(_Item):
    kind = "message"

    def __init__(self, item_id: str, index: int, logprobs: bool) -> None:
        super().__init__(item_id, index)
        self.texts: list[str] = []
        self.logprobs: list[TokenLogprob] | None = [] if logprobs else None

    def item(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": content}

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [],
                "logprobs": part_logprobs(self.logprobs or [])}

    def opening(self) -> list[Event]:
        return [{"type": "response.output_item.added", "output_index": self.index,
                 "item": self.item("in_progress", [])},
                {"type": "response.content_part.added", **self.ref(), "content_index": 0,
                 "part": {"type": "output_text", "text": "", "annotations": [],
                          "logprobs": []}}]

    def add(self, text: str, logprobs: list[TokenLogprob] | None) -> Event:
        self.texts.append(text)
        given = logprobs if self.logprobs is not None and logprobs else []
        if self.logprobs is not None:
            self.logprobs.extend(given)
        return {"type": "response.output_text.delta", **self.ref(), "content_index": 0,
                "delta": text, "logprobs": delta_logprobs(given)}

    def finished(self, status: str) -> dict[str, Any]:
        return self.item(status, [self.part("".join(self.texts))])

    def closing(self, status: str) -> list[Event]:
        self.final = self.finished(status)
        part = self.final["content"][0]
        return [{"type": "response.output_text.done", **self.ref(), "content_index": 0,
                 "text": part["text"], "logprobs": delta_logprobs(self.logprobs or [])},
                {"type": "response.content_part.done", **self.ref(), "content_index": 0,
                 "part": part},
                {"type": "response.output_item.done", "output_index": self.index,
                 "item": self.final}]


class _Reasoning(_Item):
    kind = "reasoning"

    def __init__(self, item_id: str, index: int) -> None:
        super().__init__(item_id, index)
        self.texts: list[str] = []

    def item(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "type": "reasoning", "summary": [], "content": content,
                "status": status}

    def opening(self) -> list[Event]:
        return [{"type": "response.output_item.added", "output_index": self.index,
                 "item": self.item("in_progress", [])},
                {"type": "response.content_part.added", **self.ref(), "content_index": 0,
                 "part": {"type": "reasoning_text", "text": ""}}]

    def add(self, text: str) -> Event:
        self.texts.append(text)
        return {"type": "response.reasoning_text.delta", **self.ref(), "content_index": 0,
                "delta": text}

    def finished(self, status: str) -> dict[str, Any]:
        return self.item(status, [{"type": "reasoning_text", "text": "".join(self.texts)}])

    def closing(self, status: str) -> list[Event]:
        self.final = self.finished(status)
        part = self.final["content"][0]
        return [{"type": "response.reasoning_text.done", **self.ref(), "content_index": 0,
                 "text": part["text"]},
                {"type": "response.content_part.done", **self.ref(), "content_index": 0,
                 "part": part},
                {"type": "response.output_item.done", "output_index": self.index,
                 "item": self.final}]


class _FunctionCall(_Item):
    kind = "function_call"

    def __init__(self, item_id: str, index: int, call_id: str, name: str) -> None:
        super().__init__(item_id, index)
        self.call_id = call_id
        self.name = name
        self.arguments: list[str] = []

    def item(self, status: str, arguments: str) -> dict[str, Any]:
        return {"id": self.id, "type": "function_call", "call_id": self.call_id,
                "name": self.name, "arguments": arguments, "status": status}

    def opening(self) -> list[Event]:
        return [{"type": "response.output_item.added", "output_index": self.index,
                 "item": self.item("in_progress", "")}]

    def add(self, delta: ToolCallDelta) -> list[Event]:
        if delta.name and not self.name:
            self.name = delta.name
        if not delta.arguments:
            return []
        self.arguments.append(delta.arguments)
        return [{"type": "response.function_call_arguments.delta", **self.ref(),
                 "delta": delta.arguments}]

    def finished(self, status: str) -> dict[str, Any]:
        return self.item(status, "".join(self.arguments))

    def closing(self, status: str) -> list[Event]:
        self.final = self.finished(status)
        return [{"type": "response.function_call_arguments.done", **self.ref(),
                 "arguments": self.final["arguments"]},
                {"type": "response.output_item.done", "output_index": self.index,
                 "item": self.final}]


_Kind = TypeVar("_Kind", bound=_Item)


class OutputAssembler:
    """Choice 0's chunks -> output items (``output``) and their events (``add``/``close``)."""

    def __init__(self, job_id: str, *, logprobs: bool = False) -> None:
        self.job_id = job_id
        self.logprobs = logprobs
        self.items: list[_Item] = []
        self.reasoning_tokens = 0
        self._open: list[_Item] = []
        self._calls: dict[int, _FunctionCall] = {}
        # Whitespace text (and its log-probabilities) waiting for a message item.
        self._blank = ""
        self._blank_logprobs: list[TokenLogprob] = []

    @property
    def output(self) -> list[dict[str, Any]]:
        """The items closed so far, and the open ones as they stand (the last one
        unfinished: what a failed response holds)."""
        return [item.final if item.final is not None
                else item.finished(self._status(item, "incomplete")) for item in self.items]

    def add(self, chunk: StreamChunk) -> list[Event]:
        events: list[Event] = []
        if chunk.reasoning and not chunk.text and not chunk.tool_calls:
            self.reasoning_tokens += len(chunk.token_ids)
        if chunk.reasoning:
            reasoning = self._current(_Reasoning)
            if reasoning is None:
                reasoning = self._start(_Reasoning(self._id("rs"), len(self.items)), events)
            events.append(reasoning.add(chunk.reasoning))
        if chunk.text:
            message = self._current(_Message)
            if message is None and not chunk.text.strip():
                self._blank += chunk.text
                self._blank_logprobs.extend(chunk.logprobs or ())
            else:
                if message is None:
                    message = self._start(_Message(self._id("msg"), len(self.items),
                                                   self.logprobs), events)
                events.append(message.add(self._blank + chunk.text,
                                          [*self._blank_logprobs, *(chunk.logprobs or ())]))
                self._blank, self._blank_logprobs = "", []
        for delta in chunk.tool_calls or ():
            call = self._calls.get(delta.index)
            if call is None:
                call = _FunctionCall(self._id("fc"), len(self.items),
                                     delta.id or f"call_{self.job_id}_{delta.index}",
                                     delta.name or "")
                self._calls[delta.index] = call
                self._start(call, events)
            events.extend(call.add(delta))
        return events

    def close(self, status: str) -> list[Event]:
        """Close every open item; ``status`` "incomplete" (the answer was cut off) marks
        the last one, which the cut fell in."""
        events: list[Event] = []
        if not self.items:  # nothing else: the answer is its text, blank or empty
            message = self._start(_Message(self._id("msg"), 0, self.logprobs), events)
            events.append(message.add(self._blank, self._blank_logprobs))
        for item in self._open:
            events.extend(item.closing(self._status(item, status)))
        self._open = []
        return events

    def _status(self, item: _Item, status: str) -> str:
        return status if item is self.items[-1] else "completed"

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{self.job_id}_{len(self.items)}"

    def _current(self, kind: type[_Kind]) -> _Kind | None:
        last = self._open[-1] if self._open else None
        return last if isinstance(last, kind) else None

    def _start(self, item: _Kind, events: list[Event]) -> _Kind:
        """Open ``item``, closing the open reasoning or message item (function calls stay
        open to the end: pieces of their arguments may still come)."""
        still_open: list[_Item] = []
        for other in self._open:
            if isinstance(other, _FunctionCall):
                still_open.append(other)
            else:
                events.extend(other.closing("completed"))
        self._open = [*still_open, item]
        self.items.append(item)
        events.extend(item.opening())
        return item
