"""Where each PEFT LoRA target lands in our fused projections, and how it is multiplied.

PEFT adapts Hugging Face's separate projections (``q_proj``, ``gate_proj``, ...); our
decoder fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``. An adapter of a
fused linear is block-structured: its A rows are the targets' A matrices stacked, its B
puts each target's B over that target's output columns (zero elsewhere), so one low-rank
product serves all of them.

A stack's padded rank is one slice per target at ``max_lora_rank`` each, and the batched
kernel plans for at most ``kvrelay_kernels.lora.MAX_LORA_RANK`` (128): q|k|v at rank 64
would be 192. A fused linear's targets are therefore packed into *groups* of consecutive
targets whose padded ranks fit the kernel; each group is one ``lora_apply`` on its own
output columns (q|k|v at rank <= 42 is one group; at 64 it is q|k, then v).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay_kernels.lora import MAX_LORA_RANK as KERNEL_MAX_RANK
from kvrelay_worker.models.model_config import ModelConfig

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
# The PEFT target modules an adapter may have (the names of every family we load).
LORA_TARGETS = ATTENTION_TARGETS + MLP_TARGETS


@dataclass(frozen=True)
class TargetPlace:
    """A target's home: our linear (its path inside a decoder layer) and its output
    columns there; ``in_features`` is what its A multiplies."""

    linear: str
    start: int
    stop: int
    in_features: int

    @property
    def out_features(self) -> int:
        return self.stop - self.start


def target_places(config: ModelConfig) -> dict[str, TargetPlace]:
    """Every LoRA target of a layer of ``config``'s model, by PEFT module name."""
    hidden, q, kv, inter = (config.hidden_size, config.q_size, config.kv_size,
                            config.intermediate_size)
    qkv, gate_up = "self_attn.qkv_proj", "mlp.gate_up_proj"
    return {
        "q_proj": TargetPlace(qkv, 0, q, hidden),
        "k_proj": TargetPlace(qkv, q, q + kv, hidden),
        "v_proj": TargetPlace(qkv, q + kv, q + 2 * kv, hidden),
        "o_proj": TargetPlace("self_attn.o_proj", 0, hidden, q),
        "gate_proj": TargetPlace(gate_up, 0, inter, hidden),
        "up_proj": TargetPlace(gate_up, inter, 2 * inter, hidden),
        "down_proj": TargetPlace("mlp.down_proj", 0, hidden, inter),
    }


@dataclass(frozen=True)
class LoraGroup:
    """Consecutive targets of one linear, multiplied by one ``lora_apply`` call: target
    ``i`` owns rank rows ``[i * max_rank, (i + 1) * max_rank)`` of the group's stacks."""

    targets: tuple[str, ...]
    start: int  # the group's output columns in its linear
    stop: int
    offsets: tuple[int, ...]  # each target's first column, from the group's start

    def columns(self, target: str) -> slice:
        """``target``'s output columns inside the group's slice of the output."""
        i = self.targets.index(target)
        end = self.offsets[i + 1] if i + 1 < len(self.offsets) else self.stop - self.start
        return slice(self.offsets[i], end)

    def rank_rows(self, target: str, max_rank: int) -> int:
        """The first rank row of ``target`` in this group's stacks."""
        return self.targets.index(target) * max_rank


def linear_groups(config: ModelConfig, max_rank: int) -> dict[str, list[LoraGroup]]:
    """Each adaptable linear's groups, targets in output-column order."""
    per_group = max(1, KERNEL_MAX_RANK // max_rank)
    by_linear: dict[str, list[tuple[str, TargetPlace]]] = {}
    for name, place in target_places(config).items():
        by_linear.setdefault(place.linear, []).append((name, place))
    groups: dict[str, list[LoraGroup]] = {}
    for linear, targets in by_linear.items():
        targets.sort(key=lambda item: item[1].start)
        groups[linear] = []
        for i in range(0, len(targets), per_group):
            chunk = targets[i:i + per_group]
            start = chunk[0][1].start
            groups[linear].append(LoraGroup(
                tuple(name for name, _ in chunk), start, chunk[-1][1].stop,
                tuple(place.start - start for _, place in chunk)))
    return groups


def adaptable_linears(config: ModelConfig, layer: int) -> tuple[str, ...]:
    """The linears of ``layer`` an adapter may change: a mixture-of-experts layer's MLP
    has no single gate/up/down projection (its experts are not adapted)."""
    if config.is_moe_layer(layer):
        return ("self_attn.qkv_proj", "self_attn.o_proj")
    return ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
