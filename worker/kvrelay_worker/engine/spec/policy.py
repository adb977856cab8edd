"""Which sequences speculate this step, and how many drafts each verifies.

A draft token at depth j of a sequence whose drafts are accepted with probability a is
emitted with probability a**j; verifying it costs the step's extra time for one more
token (``StepTimeCurve``). Draft tokens are taken best first while each one's expected
tokens per millisecond is at least the step's as it stands: speculation then never
lowers the step's expected output per unit of time. At batch 1 the extra tokens cost
almost nothing and every plausible draft is verified; on a compute-bound batch they
cost what real tokens do and none is. A sequence whose acceptance fell below
``MIN_RATE`` stops speculating; one refused for ``PROBE_EVERY`` steps in a row (either
way) verifies one draft, a probe that lets a pessimistic estimate recover.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay_worker.engine.spec.step_time_curve import StepTimeCurve

MIN_RATE = 0.15
PROBE_EVERY = 32  # steps a poor sequence waits between probes


@dataclass
class Candidate:
    """A decoding sequence that could verify up to ``max_drafts`` drafts."""

    key: int
    max_drafts: int
    rate: float


def choose_depths(candidates: list[Candidate], base_tokens: int, base_yield: int,
                  curve: StepTimeCurve) -> dict[int, int]:
    """Drafts to verify per candidate key (absent: none), by the rule above."""
    depths: dict[int, int] = {}
    base_ms = curve.predict_ms(base_tokens)
    if base_ms is None:  # nothing measured yet: explore
        return {c.key: c.max_drafts for c in candidates if c.max_drafts > 0}
    offers = sorted(((c.rate ** j, c.key) for c in candidates
                     for j in range(1, c.max_drafts + 1)), reverse=True)
    tokens, ms, expected = base_tokens, base_ms, float(base_yield)
    for gain, key in offers:
        next_ms = curve.predict_ms(tokens + 1)
        assert next_ms is not None
        cost = max(next_ms - ms, 0.0)
        if gain * ms < expected * cost:
            break
        depths[key] = depths.get(key, 0) + 1
        tokens, ms, expected = tokens + 1, max(ms, next_ms), expected + gain
    return depths
