"""Log-probabilities as OpenAI writes them: chat's ``logprobs.content`` and completions'
``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``.

A token is named by its text, decoded from the bytes the worker sends
(``TokenLogprob.token_bytes``; a byte-level piece of a character reads U+FFFD, as
OpenAI's does) with those bytes in chat's ``bytes``. A worker that sends no bytes, or a
request that asks with vLLM's ``return_tokens_as_token_ids``, gets ``token_id:<id>``.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from kvrelay.protocol import PromptLogprob, TokenLogprob, TopLogprob

AnyLogprob = TokenLogprob | PromptLogprob | TopLogprob


def token_name(item: AnyLogprob, as_ids: bool = False) -> str:
    text = None if as_ids else item.token
    return f"token_id:{item.token_id}" if text is None else text


def token_bytes(item: AnyLogprob) -> list[int] | None:
    return None if item.token_bytes is None else list(item.token_bytes)


def chat_logprobs(items: Sequence[TokenLogprob] | None,
                  as_ids: bool = False) -> dict[str, Any] | None:
    """Chat's ``logprobs`` object (``None`` when none were asked)."""
    if items is None:
        return None
    return {"content": [
        {"token": token_name(t, as_ids), "logprob": t.logprob, "bytes": token_bytes(t),
         "top_logprobs": [{"token": token_name(a, as_ids), "logprob": a.logprob,
                           "bytes": token_bytes(a)} for a in t.top]}
        for t in items
    ]}


class TextOffsets:
    """Where each token starts in a choice's returned text, in characters.

    Within one event the tokens' bytes say where each starts; after it the count moves to
    the end of the event's text, so offsets never run past the text the caller has even
    where the detokenizer's text is not the bytes' (a stop string cut off, say).
    """

    def __init__(self) -> None:
        self._chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def of(self, pieces: Sequence[bytes | None], text: str) -> list[int]:
        end = self._chars + len(text)
        position = self._chars
        offsets = []
        for piece in pieces:
            offsets.append(min(position, end))
            if piece is not None:
                position += len(self._decoder.decode(piece))
        self._chars = end
        return offsets


def empty_text_logprobs() -> dict[str, list[Any]]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def text_logprobs(items: Sequence[TokenLogprob | PromptLogprob | None], text: str,
                  offsets: TextOffsets, *, as_ids: bool = False,
                  first: tuple[str, bytes | None] | None = None) -> dict[str, list[Any]]:
    """Completions' ``logprobs`` for ``items``, which add ``text`` to the choice.

    A None item is the prompt's first token (nothing scores it): ``first`` names it and
    gives its bytes; its logprob and alternatives are null, as OpenAI's echo shows them.
    """
    out = empty_text_logprobs()
    pieces: list[bytes | None] = []
    for item in items:
        if item is None:
            name, piece = first or ("", None)
            out["tokens"].append(name)
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            out["tokens"].append(token_name(item, as_ids))
            out["token_logprobs"].append(item.logprob)
            out["top_logprobs"].append({token_name(a, as_ids): a.logprob for a in item.top})
            piece = item.token_bytes
        pieces.append(piece)
    out["text_offset"] = offsets.of(pieces, text)
    return out


def join_text_logprobs(parts: Sequence[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    """One choice's logprobs from consecutive parts (the echoed prompt, then the output)."""
    out = empty_text_logprobs()
    for part in parts:
        for key, values in part.items():
            out[key].extend(values)
    return out
