"""Read Server-Sent Events off an httpx response (what a browser's EventSource does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


def events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """``(id, data)`` per event; ``data`` is parsed JSON, or the string ``"[DONE]"``."""
    event_id = ""
    data: list[str] = []
    for line in response.iter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            text = "\n".join(data)
            yield event_id, text if text == "[DONE]" else json.loads(text)
            data = []


def token_ids(chunk: dict[str, Any]) -> list[int]:
    """The token ids of a completions chunk asked with ``logprobs`` and
    ``return_tokens_as_token_ids``."""
    if not chunk["choices"] or chunk["choices"][0]["logprobs"] is None:
        return []
    return [int(t.removeprefix("token_id:")) for t in chunk["choices"][0]["logprobs"]["tokens"]]
