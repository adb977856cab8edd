"""LoRA-wrapped projections: the base linear plus, per row, the low-rank update of its adapter.

Every wrapped linear holds ``max_loras`` device slots of stacked, zero-padded A/B
(``lora_layout`` says how fused projections are laid out) and reads the step's per-row
slot index from the ``LoraBatch`` the model runner fills around each forward pass, as
attention reads the batch's ``AttentionMetadata``. A step without adapter rows leaves
``row_slots`` None and costs one attribute read per projection; the base linear itself
(float, quantized) is untouched, so its weights are never copied.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from kvrelay_kernels.lora import lora_apply
from kvrelay_kernels.reference.lora_segments import LoraSegments
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.lora_layout import LoraGroup, adaptable_linears, linear_groups


class LoraBatch:
    """The step's adapter slot of every row (``[num_tokens]``, -1: none), shared by all the
    model's LoRA linears and set by the model runner; ``row_slots`` is None when no row
    has an adapter. The rows' grouping by slot (``LoraSegments``) is likewise made once
    per step and per set of live slots, for every layer."""

    def __init__(self) -> None:
        self.row_slots: torch.Tensor | None = None
        self.present: frozenset[int] = frozenset()  # the slots some row uses
        self._host: torch.Tensor | None = None
        self._masked: dict[frozenset[int], tuple[torch.Tensor, LoraSegments]] = {}

    def bind(self, row_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """The step's slots on the device (``host_slots``: the same on the host)."""
        self.row_slots = row_slots
        self._host = host_slots
        self.present = frozenset(np.unique(host_slots.numpy()).tolist()) - {-1}
        self._masked = {}

    def clear(self) -> None:
        self.row_slots = None
        self._host = None
        self.present = frozenset()
        self._masked = {}

    def rows_for(self, holders: set[int]) -> tuple[torch.Tensor, LoraSegments] | None:
        """The row slots (and their grouping) a linear whose ``holders`` slots have
        weights should apply: rows of other slots (whose adapter leaves this linear
        alone) become -1, so no work is spent on their zero padding; None when no row's
        adapter touches the linear."""
        if self.row_slots is None or self._host is None:
            return None
        live = self.present & holders
        if not live:
            return None
        found = self._masked.get(live)
        if found is None:  # once per step per distinct set, shared by every layer
            host, slots = self._host, self.row_slots
            if live != self.present:
                keep = np.isin(host.numpy(), sorted(live))
                host = torch.from_numpy(np.where(keep, host.numpy(), -1))
                slots = host.to(slots.device, slots.dtype)
            found = (slots, LoraSegments(host))
            self._masked[live] = found
        return found


class LoraLinear(nn.Module):
    """``base(x)`` plus ``(x @ A[s].T) @ B[s].T`` for each row of slot ``s``, group by group."""

    def __init__(self, base: nn.Module, batch: LoraBatch, groups: list[LoraGroup],
                 in_features: int, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.batch = batch
        self.groups = groups
        self.max_rank = max_rank
        self.stacks_a: list[torch.Tensor] = []
        self.stacks_b: list[torch.Tensor] = []
        for i, group in enumerate(groups):
            width = len(group.targets) * max_rank
            a = torch.zeros(max_loras, width, in_features, dtype=dtype, device=device)
            b = torch.zeros(max_loras, group.stop - group.start, width, dtype=dtype,
                            device=device)
            # Buffers, not parameters: moved with the module, never in a checkpoint.
            self.register_buffer(f"lora_a{i}", a, persistent=False)
            self.register_buffer(f"lora_b{i}", b, persistent=False)
            self.stacks_a.append(a)
            self.stacks_b.append(b)
        # A group over every output column adds to ``y`` itself, not to a column slice.
        self._whole = [g.start == 0 and g.stop == base.out_features for g in groups]
        # Per group, the slots whose adapter has a target in it (the others are zeros).
        self._holders: list[set[int]] = [set() for _ in groups]

    def _apply(self, fn: Any, recurse: bool = True) -> LoraLinear:
        """Moving the module replaces its buffers: the stacks' lists follow them."""
        super()._apply(fn, recurse)
        self.stacks_a = [getattr(self, f"lora_a{i}") for i in range(len(self.groups))]
        self.stacks_b = [getattr(self, f"lora_b{i}") for i in range(len(self.groups))]
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.base(x)
        if self.batch.row_slots is None:
            return y
        for group, whole, holders, a, b in zip(self.groups, self._whole, self._holders,
                                               self.stacks_a, self.stacks_b, strict=True):
            rows = self.batch.rows_for(holders)
            if rows is not None:
                out = y if whole else y[:, group.start:group.stop]
                lora_apply(out, x, a, b, rows[0], slots_checked=True, segments=rows[1])
        return y

    @torch.no_grad()
    def load_slot(self, slot: int, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
                  ) -> None:
        """Put one adapter's targets of this linear (``{target: (A, B scaled)}``, maybe
        none) into ``slot``, zeroing whatever was there."""
        r = self.max_rank
        for group, holders, a, b in zip(self.groups, self._holders, self.stacks_a,
                                        self.stacks_b, strict=True):
            a[slot].zero_()
            b[slot].zero_()
            if any(target in pairs for target in group.targets):
                holders.add(slot)
            else:
                holders.discard(slot)
            for target in group.targets:
                if target not in pairs:
                    continue
                lora_a, lora_b = pairs[target]
                rank = lora_a.shape[0]
                first = group.rank_rows(target, r)
                columns = group.columns(target)
                a[slot, first:first + rank].copy_(lora_a)
                b[slot, columns, first:first + rank].copy_(lora_b)


def install_lora(model: CausalLM, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> tuple[LoraBatch, dict[tuple[int, str], LoraLinear]]:
    """Wrap every adaptable projection of ``model`` in place; returns the shared batch
    and the wrapped linears by (layer, path inside the layer)."""
    config = model.config
    groups = linear_groups(config, max_rank)
    batch = LoraBatch()
    wrapped: dict[tuple[int, str], LoraLinear] = {}
    for index, layer in enumerate(model.decoder_layers()):
        for path in adaptable_linears(config, index):
            owner_name, attr = path.split(".")
            owner = getattr(layer, owner_name)
            base = getattr(owner, attr)
            in_features = base.in_features
            linear = LoraLinear(base, batch, groups[path], in_features, max_loras, max_rank,
                                dtype, device)
            setattr(owner, attr, linear)
            wrapped[(index, path)] = linear
    return batch, wrapped
