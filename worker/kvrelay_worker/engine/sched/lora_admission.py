"""At most ``max_loras`` distinct LoRA adapters among running sequences.

Each running adapter needs a device slot for every step its sequences run
(``engine/lora/lora_manager.py``), and there are ``max_loras`` of them. Admission holds
back a waiting sequence whose adapter would be one too many (it stays queued in its
place, and the ones behind it may pass); a request of the base model, or of an adapter
already running, is never held back by this.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvrelay_worker.engine.sched.sequence import Sequence


class LoraAdmission:
    """The adapters of one ``schedule`` call's running sequences, as admissions add them."""

    def __init__(self, max_loras: int, running: Iterable[Sequence]) -> None:
        self.max_loras = max_loras
        self._running = {id(s.lora) for s in running if s.lora is not None}

    def admits(self, seq: Sequence) -> bool:
        """Whether ``seq`` may run now as far as adapter slots go."""
        return (seq.lora is None or id(seq.lora) in self._running
                or len(self._running) < self.max_loras)

    def add(self, seq: Sequence) -> None:
        """``seq`` was admitted: its adapter now runs."""
        if seq.lora is not None:
            self._running.add(id(seq.lora))
