"""The exact bytes each token id stands for, as logprobs report them (``token_bytes``).

Decoding one token alone loses what a client scoring text needs: a byte-level token may
hold part of a UTF-8 character, and SentencePiece decoders drop a leading space. So the
bytes are read from the vocabulary itself, per the tokenizer's scheme:

- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen): every character of a token stands for
  one byte through GPT-2's byte-to-character table, inverted here;
- SentencePiece (Llama 2, Mistral, Gemma): ``▁`` is a space, ``<0xNN>`` the byte NN
  when the model falls back to bytes;
- added and special tokens: their text; anything else: the token decoded alone.

Computed once per id, on first use, and kept per tokenizer: only requests that ask for
logprobs pay for it. Torch-free (the worker's event path imports it).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPIECE_SPACE = "\u2581"


def _byte_level_table() -> dict[str, int]:
    """Character -> byte of GPT-2's byte-level alphabet.

    Bytes that print as themselves (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) keep their
    code point; the others (controls, space, ...) take code points 256, 257, ... in order.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def _decoder_parts(tokenizer: Any) -> list[dict[str, Any]]:
    """The fast tokenizer's decoder steps as JSON objects (a Sequence flattened)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return []
    try:
        root = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return []
    parts: list[dict[str, Any]] = []
    stack = [root]
    while stack:
        part = stack.pop(0)
        if isinstance(part, dict):
            parts.append(part)
            stack.extend(part.get("decoders") or [])
    return parts


def _scheme(tokenizer: Any) -> tuple[str, str]:
    """("byte_level" | "sentencepiece" | "decode", the SentencePiece space marker)."""
    parts = _decoder_parts(tokenizer)
    kinds = {p.get("type") for p in parts}
    if "ByteLevel" in kinds:
        return "byte_level", ""
    for part in parts:
        if part.get("type") == "Metaspace":
            return "sentencepiece", str(part.get("replacement") or _SPIECE_SPACE)
        if part.get("type") == "Replace" and part.get("content") == " ":
            pattern = part.get("pattern") or {}
            if pattern.get("String"):
                return "sentencepiece", str(pattern["String"])
    if "ByteFallback" in kinds or hasattr(tokenizer, "sp_model"):
        return "sentencepiece", _SPIECE_SPACE
    return "decode", ""


class TokenBytes:
    """``token_bytes(token_id)``: the bytes the token stands for (see the module)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.scheme, self._space = _scheme(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = {int(i): str(getattr(t, "content", t)) for i, t in added.items()}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._compute(token_id)
        return cached

    def _compute(self, token_id: int) -> bytes:
        text = self._added.get(token_id)
        if text is not None:
            return text.encode()
        if self.scheme == "decode":
            return self._decoded(token_id)
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return self._decoded(token_id)
        if self.scheme == "byte_level":
            if all(c in _BYTE_LEVEL for c in piece):
                return bytes(_BYTE_LEVEL[c] for c in piece)
            return piece.encode()  # not from the byte alphabet: plain text
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        return piece.replace(self._space, " ").encode()

    def _decoded(self, token_id: int) -> bytes:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False)
        return str(text).encode()


_TABLES: weakref.WeakKeyDictionary[Any, TokenBytes] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def token_bytes_for(tokenizer: Any) -> TokenBytes:
    """The ``TokenBytes`` of ``tokenizer``, made once and kept while the tokenizer lives."""
    with _LOCK:
        try:
            table = _TABLES.get(tokenizer)
        except TypeError:  # not weakly referenceable: a table per call
            return TokenBytes(tokenizer)
        if table is None:
            table = _TABLES[tokenizer] = TokenBytes(tokenizer)
        return table
