"""The mixture-of-experts MLP: one grouped matmul over all experts equals the per-expert
loop, and both equal a dense computation of the routing rule written out here."""

from __future__ import annotations

import pytest
import torch

from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.moe import SparseMoE


def moe(experts: int, top_k: int, normalize: bool) -> SparseMoE:
    config = ModelConfig(vocab_size=8, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=16, num_experts=experts, num_experts_per_tok=top_k,
                         moe_intermediate_size=24, norm_topk_prob=normalize,
                         moe_layers=(True,))
    layer = SparseMoE(config)
    generator = torch.Generator().manual_seed(experts * 10 + top_k)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return layer


def dense_reference(layer: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by the router's top-k rule (zero elsewhere)."""
    probs = torch.softmax(x @ layer.gate.weight.T, dim=-1)
    top, chosen = probs.topk(layer.top_k, dim=-1)
    if layer.normalize_top_k:
        top = top / top.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, chosen, top)
    out = torch.zeros_like(x)
    for e in range(layer.num_experts):
        gate, up = (x @ layer.w13[e].T).split(layer.intermediate_size, dim=-1)
        out += weights[:, e : e + 1] * ((torch.nn.functional.silu(gate) * up) @ layer.w2[e].T)
    return out


@pytest.mark.parametrize(("experts", "top_k", "normalize"), [(4, 2, True), (8, 2, False),
                                                             (8, 3, True), (3, 1, False)])
@pytest.mark.parametrize("tokens", [1, 5, 64])
@torch.no_grad()
def test_grouped_and_loop_equal_the_routing_rule(experts: int, top_k: int, normalize: bool,
                                                 tokens: int) -> None:
    layer = moe(experts, top_k, normalize)
    x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens))
    expected = dense_reference(layer, x)
    assert layer.grouped, "this torch has grouped_mm: the grouped path is the default"
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    layer.grouped = False  # the padded batch where pairs >= experts, else the loop
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    layer.padded = False  # the loop always
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 64])
@torch.no_grad()
def test_without_grouped_mm_a_large_step_reads_nothing_back(
        tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop reads each layer's expert counts back (a wait for the device); a step
    with at least as many (token, expert) pairs as experts takes the padded batch,
    which reads nothing back, and gives the same result."""
    layer = moe(8, 4, True)
    layer.grouped = False
    x = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(3))
    expected = dense_reference(layer, x)
    reads: list[int] = []
    tolist, item = torch.Tensor.tolist, torch.Tensor.item

    def counted_tolist(self: torch.Tensor) -> object:
        reads.append(1)
        return tolist(self)

    def counted_item(self: torch.Tensor) -> object:
        reads.append(1)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    monkeypatch.setattr(torch.Tensor, "item", counted_item)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert len(reads) == (0 if tokens * 4 >= 8 else 1)
