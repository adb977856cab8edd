"""A click number type that refuses NaN and infinity.

``click.FloatRange`` lets ``nan`` through every bound (each comparison is false) and
takes ``inf`` as a timeout that never ends; a timeout of ``nan`` then makes waits spin.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` for finite numbers only."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
