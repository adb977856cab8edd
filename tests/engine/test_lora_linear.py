"""A LoRA-wrapped fused projection adds, per row, exactly its adapter's update.

The fused q|k|v layout (targets' A stacked, B over each target's columns, targets packed
into groups the kernel's rank fits) is checked against the plain definition: the base
output plus ``B_t (A_t x)`` in target ``t``'s columns, for each target the row's adapter
has, and nothing for rows without an adapter. Both layouts are checked: one group for
q|k|v (a narrow max rank) and q|k then v (rank 64).
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_worker.models.cpu_linear import Linear
from kvrelay_worker.models.lora_layout import linear_groups, target_places
from kvrelay_worker.models.lora_linear import LoraBatch, LoraLinear
from kvrelay_worker.models.model_config import ModelConfig

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
QKV = "self_attn.qkv_proj"


def test_fused_targets_pack_into_groups_the_kernel_fits() -> None:
    narrow = linear_groups(CONFIG, 16)[QKV]
    assert [(g.targets, g.start, g.stop, g.offsets) for g in narrow] == [
        (("q_proj", "k_proj", "v_proj"), 0, 64, (0, 32, 48))]
    wide = linear_groups(CONFIG, 64)[QKV]  # 3 x 64 is over the kernel's 128
    assert [(g.targets, g.start, g.stop, g.offsets) for g in wide] == [
        (("q_proj", "k_proj"), 0, 48, (0, 32)), (("v_proj",), 48, 64, (0,))]
    assert [g.targets for g in linear_groups(CONFIG, 64)["mlp.gate_up_proj"]] == [
        ("gate_proj", "up_proj")]


def _pairs(targets: tuple[str, ...], rank: int, seed: int
           ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    places = target_places(CONFIG)
    return {t: (torch.randn(rank, places[t].in_features, generator=gen),
                torch.randn(places[t].out_features, rank, generator=gen)) for t in targets}


@pytest.mark.parametrize("max_rank", [8, 64])
def test_each_row_gets_its_own_adapters_update(max_rank: int) -> None:
    torch.manual_seed(0)
    base = Linear(32, 64, bias=True)
    batch = LoraBatch()
    linear = LoraLinear(base, batch, linear_groups(CONFIG, max_rank)[QKV], 32, max_loras=3,
                        max_rank=max_rank, dtype=torch.float32, device=torch.device("cpu"))
    # Slot 1 adapts k alone: at rank 64 its rows skip the v group (masked to -1 there).
    adapters = {0: _pairs(("q_proj", "v_proj"), 8, seed=1),
                1: _pairs(("k_proj",), 8, seed=5),
                2: _pairs(("q_proj", "k_proj", "v_proj"), 4, seed=2)}
    for slot, pairs in adapters.items():
        linear.load_slot(slot, pairs)
    x = torch.randn(7, 32)
    slots = [-1, 0, 2, 1, -1, 2, 1]
    with torch.no_grad():
        plain = base(x)
        assert torch.equal(linear(x), plain)  # no adapter rows: the base alone
        batch.bind(torch.tensor(slots), torch.tensor(slots))
        got = linear(x)
    expected = plain.clone()
    places = target_places(CONFIG)
    for row, slot in enumerate(slots):
        for target, (a, b) in adapters.get(slot, {}).items():
            place = places[target]
            expected[row, place.start:place.stop] += b @ (a @ x[row])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(got[1], plain[1])  # the update is there at all


def test_loading_a_slot_replaces_what_it_held() -> None:
    base = Linear(32, 64, bias=False)
    batch = LoraBatch()
    linear = LoraLinear(base, batch, linear_groups(CONFIG, 8)[QKV], 32, max_loras=1,
                        max_rank=8, dtype=torch.float32, device=torch.device("cpu"))
    linear.load_slot(0, _pairs(("q_proj", "k_proj", "v_proj"), 8, seed=3))
    linear.load_slot(0, _pairs(("v_proj",), 2, seed=4))  # a smaller adapter over it
    x = torch.randn(2, 32)
    batch.bind(torch.tensor([0, 0]), torch.tensor([0, 0]))
    with torch.no_grad():
        got = linear(x)
        plain = base(x)
    torch.testing.assert_close(got[:, :48], plain[:, :48])  # q and k: nothing left over
    assert not torch.allclose(got[:, 48:], plain[:, 48:])
