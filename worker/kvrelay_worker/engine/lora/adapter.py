"""One loaded LoRA adapter, as requests and the engine's bookkeeping see it.

A request holds its adapter object, not its name: removing or replacing the name affects
later requests only, and the requests already in the engine finish with the weights
they were accepted with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvrelay_worker.loading import LoraWeights


@dataclass(frozen=True)
class LoraInfo:
    """What ``LLMEngine.list_loras`` reports of one adapter (``slot`` None: host only)."""

    name: str
    path: str
    rank: int
    targets: tuple[str, ...]
    scaling: float
    slot: int | None
    loaded_at: float
    digest: str


@dataclass(eq=False)
class LoraAdapter:
    """A loaded adapter: its weights in host memory, grouped per wrapped linear, and the
    device slot it occupies (None when it has none now)."""

    name: str
    path: str
    weights: LoraWeights
    loaded_at: float
    slot: int | None = None
    # The engine step that last ran a request with it: the slots' LRU order.
    last_used: int = -1
    # Its name was removed (or replaced): no new request gets it; its slot goes first.
    removed: bool = False
    by_linear: dict[tuple[int, str], dict[str, tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict, repr=False)

    @property
    def cache_key(self) -> str:
        """What the prefix cache keys this adapter's blocks by: its content, so the same
        files under two names share blocks and a changed file under one name does not."""
        return self.weights.digest

    def info(self) -> LoraInfo:
        w = self.weights
        return LoraInfo(self.name, self.path, w.rank, w.targets, w.scaling, self.slot,
                        self.loaded_at, w.digest)
