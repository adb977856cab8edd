"""Prompt chunks sized to an inter-token latency target (``EngineConfig.target_step_ms``).

Why: every decoding stream waits for the whole step its token is in, so a step's time is
their inter-token latency. With a fixed token budget a long prompt's chunk makes that
step as long as the chunk takes; here each step's prompt chunks get only what the
measured cost model (``step_cost.py``) predicts fits in the target beside the step's
decodes. Decodes are never cut; the step's first prompt chunk always gets at least
``min_chunk`` tokens, so a prompt makes steady progress however busy the decodes are.

Cold start: the model is never asked about a chunk more than ``growth`` times the largest
it has measured (``min_chunk`` before any), so chunks start small and grow only as fast
as the measurements justify.
"""

from __future__ import annotations

from kvrelay_worker.engine.sched.step_cost import StepCostModel, StepShape


class StepPlan:
    """One step's prompt chunks, sized one after another against what is already in it."""

    def __init__(self, pacer: PrefillPacer, decode_contexts: list[int]) -> None:
        self.pacer = pacer
        self.shape = StepShape.of((context, 1) for context in decode_contexts)
        self.decodes_ahead = len(decode_contexts)  # decode rows not yet placed
        self.has_prefill = False

    def place_decode(self) -> None:
        self.decodes_ahead = max(0, self.decodes_ahead - 1)

    def prefill_chunk(self, context: int, remaining: int, budget: int) -> int:
        """Tokens of a prompt (``context`` computed, ``remaining`` to go) for this step.

        ``budget`` is the step's token budget left; room for the decodes still to be
        placed is kept out of it.
        """
        room = max(0, budget - self.decodes_ahead)
        if room <= 0:
            return 0
        chunk = self.pacer.chunk(self.shape, context, min(remaining, room),
                                 first=not self.has_prefill)
        if chunk > 0:
            self.shape = self.shape.plus_prefill(context, chunk)
            self.has_prefill = True
        return chunk


class PrefillPacer:
    """The target, the minimum chunk and the cost model they are judged by."""

    def __init__(self, target_ms: float, min_chunk: int, model: StepCostModel | None = None,
                 growth: float = 2.0) -> None:
        self.target_ms = target_ms
        self.min_chunk = min_chunk
        self.model = model or StepCostModel()
        self.growth = growth

    def plan(self, decode_contexts: list[int]) -> StepPlan:
        """A plan for a step whose decode rows follow ``decode_contexts`` computed tokens."""
        return StepPlan(self, decode_contexts)

    def observe(self, shape: StepShape, ms: float) -> None:
        self.model.observe(shape, ms)

    def chunk(self, shape: StepShape, context: int, remaining: int, first: bool) -> int:
        """The largest chunk (up to ``remaining``) whose step is predicted within target.

        Capped at ``growth`` times the largest chunk measured so far; the step's
        ``first`` chunk is never below ``min_chunk`` (nor ``remaining``), later ones may
        be 0.
        """
        floor = min(self.min_chunk, remaining) if first else 0
        trusted = max(self.min_chunk, int(self.growth * self.model.largest_prefill))
        cap = min(remaining, trusted)
        if cap <= floor:
            return floor
        if self._fits(shape, context, cap):
            return cap
        lo, hi = floor, cap  # the predicted time only grows with the chunk: bisect
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._fits(shape, context, mid):
                lo = mid
            else:
                hi = mid
        return lo

    def _fits(self, shape: StepShape, context: int, num_tokens: int) -> bool:
        return self.model.predict_ms(shape.plus_prefill(context, num_tokens)) <= self.target_ms
