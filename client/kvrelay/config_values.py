"""Checks for the SDK's own settings (durations and counts), not the sampling fields.

NaN and infinity pass every ``<= 0`` test, and then a wait computed from them spins
(``stream_timeout=nan`` busy-loops) or never ends; so a duration must be a finite
number of seconds, and a count a real int.
"""

from __future__ import annotations

import math

from kvrelay.errors import InvalidRequest

__all__ = ["count", "seconds"]


def seconds(name: str, value: object) -> float:
    """``value`` as a finite, positive number of seconds, or ``InvalidRequest``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def count(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, or ``InvalidRequest``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise InvalidRequest(f"{name} must be >= {minimum}, got {value}")
    return value
