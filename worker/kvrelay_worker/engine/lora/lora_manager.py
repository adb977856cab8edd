"""Loaded LoRA adapters and the device slots of the ones in use: a bounded LRU.

Every loaded adapter stays in host memory until removed; ``max_loras`` device slots hold
the ones running requests use. Before each step the engine calls ``activate`` with the
running sequences: an adapter without a slot takes a free one, else the slot of a removed
adapter, else that of the least recently used adapter no running sequence holds. The
scheduler admits at most ``max_loras`` distinct adapters among running sequences
(``sched/lora_admission.py``), so a slot is always found and an adapter in use is never
evicted. Loading and removing happen between steps (the engine is single-threaded).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import torch

from kvrelay_worker.engine.errors import LoraAdapterError, LoraNotLoadedError
from kvrelay_worker.engine.lora.adapter import LoraAdapter, LoraInfo
from kvrelay_worker.engine.sched.sequence import Sequence
from kvrelay_worker.loading import read_lora_folder
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.lora_layout import target_places
from kvrelay_worker.models.lora_linear import LoraBatch, LoraLinear, install_lora


class LoraManager:
    """The engine's adapters by name, and which adapter each device slot holds."""

    def __init__(self, model: CausalLM, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.config = model.config
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.batch: LoraBatch
        self.linears: dict[tuple[int, str], LoraLinear]
        self.batch, self.linears = install_lora(model, max_loras, max_rank, dtype, device)
        self._adapters: dict[str, LoraAdapter] = {}
        self._slots: list[LoraAdapter | None] = [None] * max_loras
        self._step = 0
        # Adapters copied into a slot so far (a test and a benchmark read it).
        self.num_slot_loads = 0

    # ------------------------------------------------------------------ names

    def add(self, name: str, path: str | Path) -> LoraInfo:
        """Load the PEFT folder at ``path`` under ``name`` (replacing any adapter of that
        name for later requests); raises ``LoraAdapterError`` when it cannot be served."""
        if not isinstance(name, str) or not name:
            raise LoraAdapterError(f"an adapter name must be a non-empty string, got {name!r}")
        weights = read_lora_folder(path, self.config, self.max_rank)
        places = target_places(self.config)
        adapter = LoraAdapter(name, str(path), weights, time.time())
        for (layer, target), pair in weights.pairs.items():
            key = (layer, places[target].linear)
            adapter.by_linear.setdefault(key, {})[target] = pair
        old = self._adapters.get(name)
        if old is not None:
            old.removed = True
        self._adapters[name] = adapter
        return adapter.info()

    def remove(self, name: str) -> bool:
        """Forget ``name`` for new requests; False when no adapter has it. Requests
        already accepted finish with it; its slot is reused first."""
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            return False
        adapter.removed = True
        return True

    def get(self, name: str) -> LoraAdapter:
        """The adapter a new request names; ``LoraNotLoadedError`` when there is none."""
        adapter = self._adapters.get(name)
        if adapter is None:
            held = ", ".join(sorted(self._adapters)) or "none"
            raise LoraNotLoadedError(f"LoRA adapter {name!r} is not loaded on this worker "
                                     f"(loaded: {held})")
        return adapter

    def loaded(self) -> list[LoraInfo]:
        """Every adapter a request may name, in the order they were loaded."""
        return [adapter.info() for adapter in self._adapters.values()]

    # ------------------------------------------------------------------ slots

    def activate(self, running: Iterable[Sequence]) -> None:
        """Give every adapter of a running sequence a slot (before the step's forward
        pass, after scheduling: every sequence the step runs is running)."""
        self._step += 1
        needed: dict[int, LoraAdapter] = {}
        for seq in running:
            if seq.lora is not None:
                needed[id(seq.lora)] = seq.lora
        for adapter in needed.values():
            adapter.last_used = self._step
        for slot, holder in enumerate(self._slots):
            if holder is not None and holder.removed and id(holder) not in needed:
                holder.slot = None  # nothing can use it any more: drop it (host memory)
                self._slots[slot] = None
        for adapter in needed.values():
            if adapter.slot is None:
                self._load(adapter, self._free_slot(needed))

    def stats(self) -> dict[str, int]:
        """Adapters loaded, device slots in use (of ``max_loras``), copies into slots."""
        return {"loras_loaded": len(self._adapters),
                "lora_slots_used": sum(holder is not None for holder in self._slots),
                "lora_slots": self.max_loras, "lora_slot_loads": self.num_slot_loads}

    def slot_holders(self) -> list[str | None]:
        """The name of the adapter in each slot (None: empty), for tests and stats."""
        return [None if a is None else a.name for a in self._slots]

    def _free_slot(self, needed: dict[int, LoraAdapter]) -> int:
        """An empty slot, else a removed adapter's, else the least recently used one's;
        never the slot of an adapter a running sequence holds."""
        best: tuple[int, int, int] | None = None
        for slot, holder in enumerate(self._slots):
            if holder is None:
                return slot
            if id(holder) in needed:
                continue
            rank = (0 if holder.removed else 1, holder.last_used, slot)
            if best is None or rank < best:
                best = rank
        if best is None:  # the scheduler's admission limit makes this unreachable
            raise RuntimeError(f"more than max_loras={self.max_loras} adapters are running")
        return best[2]

    def _load(self, adapter: LoraAdapter, slot: int) -> None:
        """Copy ``adapter`` into ``slot`` of every wrapped linear (zeros where it has no
        target), evicting the slot's holder."""
        holder = self._slots[slot]
        if holder is not None:
            holder.slot = None
        for key, linear in self.linears.items():
            linear.load_slot(slot, adapter.by_linear.get(key, {}))
        self._slots[slot] = adapter
        adapter.slot = slot
        self.num_slot_loads += 1
