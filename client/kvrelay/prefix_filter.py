"""The bounded form in which a worker advertises the prompt prefixes it holds.

A Bloom filter of ``FILTER_BITS`` bits over the worker's recent prefix fingerprints
(``prefix_fingerprints``), sent base64-encoded in its heartbeat: 2 KiB whatever the
number of prompts served, and a reader tests a fingerprint without a round trip. With
the worker's cap of ``MAX_ADVERTISED`` fingerprints (``HASHES`` bits each) a fingerprint
it does not hold tests positive about once in 400; a false positive only sends a job to
a worker that does not hold its prefix, which placement tolerates (it is advisory).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Final

__all__ = ["FILTER_BITS", "HASHES", "MAX_ADVERTISED", "PrefixFilter"]

FILTER_BITS: Final = 16384
HASHES: Final = 4
# The most fingerprints a worker puts in its filter (its most recently used ones).
MAX_ADVERTISED: Final = 1024

_MASK32: Final = 0xFFFFFFFF


def _positions(fingerprint: int) -> list[int]:
    """``HASHES`` bit positions from one 64-bit fingerprint (double hashing)."""
    low = fingerprint & _MASK32
    high = (fingerprint >> 32) | 1  # odd, so the probes differ
    return [(low + i * high) % FILTER_BITS for i in range(HASHES)]


class PrefixFilter:
    """A set of fingerprints that may answer "yes" wrongly, never "no" wrongly."""

    __slots__ = ("_bits",)

    def __init__(self, fingerprints: Iterable[int] = ()) -> None:
        bits = 0
        for fingerprint in fingerprints:
            for position in _positions(fingerprint):
                bits |= 1 << position
        self._bits = bits

    def __contains__(self, fingerprint: int) -> bool:
        return all(self._bits >> position & 1 for position in _positions(fingerprint))

    def __bool__(self) -> bool:
        return self._bits != 0

    def leading_matches(self, chain: list[int]) -> int:
        """How many of ``chain``'s first fingerprints, in a row, the filter holds."""
        for count, fingerprint in enumerate(chain):
            if fingerprint not in self:
                return count
        return len(chain)

    def encode(self) -> str:
        """Base64 of the bitmap ('' when empty, so an idle worker's heartbeat stays small)."""
        if not self._bits:
            return ""
        return base64.b64encode(self._bits.to_bytes(FILTER_BITS // 8, "little")).decode()

    @classmethod
    def decode(cls, text: str) -> PrefixFilter:
        """The filter ``encode`` wrote; an empty or malformed one holds nothing."""
        result = cls()
        if not text:
            return result
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return result
        if len(raw) == FILTER_BITS // 8:
            result._bits = int.from_bytes(raw, "little")
        return result
