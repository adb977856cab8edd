"""What the worker needs of an engine: ``LLMEngine``, or ``SimulatedEngine`` for scale tests.

Written as a protocol so the worker's modules need not import ``LLMEngine`` (and torch)
to name the type: a simulated worker runs without torch at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvrelay.protocol import ToolCallDelta
from kvrelay_worker.engine.outputs import StepOutput
from kvrelay_worker.engine.prompt import Prompt
from kvrelay_worker.engine.sampling_params import SamplingParams


class ServedEngine(Protocol):
    vocab_size: int
    max_model_len: int

    @property
    def tokenizer(self) -> Any: ...

    @property
    def device(self) -> Any: ...  # a torch.device, or "simulated"

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    prior_outputs: Sequence[Sequence[int]] | None = None,
                    prior_texts: Sequence[str] | None = None,
                    prior_finish_reasons: Sequence[str | None] | None = None,
                    prior_reasoning: Sequence[str] | None = None,
                    prior_tool_calls: Sequence[Sequence[ToolCallDelta]] | None = None) -> list[int]: ...

    def abort_request(self, request_id: str, *, report: bool = True) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[StepOutput]: ...

    def stats(self) -> dict[str, Any]: ...
