"""Fingerprints of a prompt's leading chunks, for prefix-aware placement.

A worker's prefix cache holds the KV blocks of prompts it served recently, and two
prompts that share a long start (a system prompt, a conversation so far) share those
blocks. The SDK has no tokenizer, so it cannot name blocks the way the engine does;
instead it cuts the prompt's *text* (or its token ids, when it sends ids) into fixed-size
chunks and hashes them as a chain: fingerprint ``i`` covers chunks ``0..i``. Two prompts
that agree on their first ``k`` whole chunks share their first ``k`` fingerprints and
differ from then on. Workers compute the same chain (this module) for every prompt they
serve and advertise the recent ones (``prefix_filter``); the SDK sends a job to the
worker matching the longest leading run of its chain.

Only whole chunks count: a prompt shorter than one chunk has no fingerprint (placing it
would save less prefill than it risks in imbalance). Chat messages are hashed as their
roles and contents in order, the part of the rendered template that varies, so the
same conversation gives the same chain whatever template the worker applies. The cache
salt and the model seed the chain: prompts the engine would not share blocks between
never share fingerprints.
"""

from __future__ import annotations

import hashlib
from typing import Final

from kvrelay.protocol import GenerateRequest

__all__ = [
    "CHUNK_CHARS",
    "CHUNK_TOKENS",
    "MAX_CHUNKS",
    "prompt_fingerprints",
    "request_fingerprints",
]

# About 64 tokens of English text (~4 characters a token): four KV blocks of 16.
CHUNK_CHARS: Final = 256
CHUNK_TOKENS: Final = 64
# Past 64 chunks (~4,000 tokens) a longer match adds little: the chain stops there, so
# hashing a huge prompt costs at most 16 KiB of input.
MAX_CHUNKS: Final = 64

# Separators that cannot occur in a message's role (roles are short names).
_ROLE_END: Final = "\x1f"
_MESSAGE_END: Final = "\x1e"


def _chain(seed: bytes, chunks: list[bytes]) -> list[int]:
    """``fingerprint[i] = H(fingerprint[i-1] || chunk[i])``, 64-bit, seeded by ``seed``."""
    previous = hashlib.blake2b(seed, digest_size=8).digest()
    chain: list[int] = []
    for chunk in chunks:
        previous = hashlib.blake2b(previous + chunk, digest_size=8).digest()
        chain.append(int.from_bytes(previous, "big"))
    return chain


def _text_chunks(text: str) -> list[bytes]:
    whole = min(len(text) // CHUNK_CHARS, MAX_CHUNKS)
    return [text[i * CHUNK_CHARS:(i + 1) * CHUNK_CHARS].encode("utf-8", "surrogatepass")
            for i in range(whole)]


def _token_chunks(ids: list[int]) -> list[bytes]:
    whole = min(len(ids) // CHUNK_TOKENS, MAX_CHUNKS)
    return [b",".join(str(t).encode() for t in ids[i * CHUNK_TOKENS:(i + 1) * CHUNK_TOKENS])
            for i in range(whole)]


def prompt_fingerprints(
    *,
    model: str,
    prompt: str | None = None,
    messages: list[tuple[str, str]] | None = None,
    prompt_token_ids: list[int] | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """The chain of leading-chunk fingerprints of one prompt (given one of three ways)."""
    if prompt_token_ids is not None:
        kind, chunks = "ids", _token_chunks(prompt_token_ids)
    elif messages is not None:
        text = "".join(f"{role}{_ROLE_END}{content}{_MESSAGE_END}" for role, content in messages)
        kind, chunks = "chat", _text_chunks(text)
    else:
        kind, chunks = "text", _text_chunks(prompt or "")
    seed = "\x00".join((kind, model, cache_salt or "")).encode("utf-8", "surrogatepass")
    return _chain(seed, chunks)


def request_fingerprints(request: GenerateRequest) -> list[int]:
    """``prompt_fingerprints`` of a request's prompt (the SDK and the worker both call it)."""
    messages = (None if request.messages is None
                else [(message.role, message.content or "") for message in request.messages])
    return prompt_fingerprints(model=request.model, prompt=request.prompt, messages=messages,
                               prompt_token_ids=request.prompt_token_ids,
                               cache_salt=request.cache_salt)
