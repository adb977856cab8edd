"""Every family runs one q/k/v matmul and one gate/up matmul per layer, fused exactly.

The loader concatenates each layer's checkpoint projections into one weight (and one bias)
as they stream in; a decode step then multiplies the batch by fewer, larger matrices. The
fusion must be exact: the fused tensors are the checkpoint's, bit for bit, in q, k, v and
gate, up order, for every family (biases of Qwen2, Qwen3's and Gemma 3's q/k norms kept
apart, Phi-3's already-fused tensors as stored, MoE experts stacked).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import TINY_MODEL_NAMES
from safetensors.torch import load_file
from torch import nn

from kvrelay_worker.loading import load_model_source
from kvrelay_worker.models.cpu_linear import cpu_few_rows_linear
from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.layers import GatedMLP
from kvrelay_worker.models.moe import SparseMoE

UNFUSED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def _load(folder: Path) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    loaded = load_model_source(folder)
    model = build_model(loaded.config, loaded.weights(), torch.float32, torch.device("cpu"),
                        max_position=64)
    # Mixtral's checkpoints name the MoE block ``block_sparse_moe``; ours calls it ``mlp``.
    checkpoint = {k.removeprefix("model.").replace(".block_sparse_moe.", ".mlp."): v
                  for k, v in load_file(str(folder / "model.safetensors")).items()}
    return model, checkpoint


def _fused(checkpoint: dict[str, torch.Tensor], prefix: str, parts: tuple[str, ...],
           fused_name: str, leaf: str) -> torch.Tensor:
    """The checkpoint's own fused tensor (Phi-3), else its parts concatenated in order."""
    if f"{prefix}.{fused_name}.{leaf}" in checkpoint:
        return checkpoint[f"{prefix}.{fused_name}.{leaf}"]
    return torch.cat([checkpoint[f"{prefix}.{part}.{leaf}"] for part in parts])


@pytest.mark.parametrize("name", TINY_MODEL_NAMES)
def test_projections_are_fused_exactly(name: str, tiny_model: Callable[[str], Path]) -> None:
    model, checkpoint = _load(tiny_model(name))
    assert not [n for n, _ in model.named_modules() if n.rsplit(".", 1)[-1] in UNFUSED]
    for i, layer in enumerate(model.layers):
        prefix = f"layers.{i}"
        attn = layer.self_attn
        for leaf in ("weight", "bias"):
            param = getattr(attn.qkv_proj, leaf)
            if param is None:
                assert f"{prefix}.self_attn.q_proj.{leaf}" not in checkpoint
                continue
            expected = _fused(checkpoint, f"{prefix}.self_attn", ("q_proj", "k_proj", "v_proj"),
                              "qkv_proj", leaf)
            assert torch.equal(param, expected), (name, i, leaf)
        if attn.q_norm is not None:
            assert torch.equal(attn.q_norm.weight,
                               checkpoint[f"{prefix}.self_attn.q_norm.weight"]
                               + model.config.norm_weight_offset)
        mlp = layer.mlp
        if isinstance(mlp, GatedMLP):
            expected = _fused(checkpoint, f"{prefix}.mlp", ("gate_proj", "up_proj"),
                              "gate_up_proj", "weight")
            assert torch.equal(mlp.gate_up_proj.weight, expected), (name, i)
        else:
            assert isinstance(mlp, SparseMoE)
            _check_experts(checkpoint, f"{prefix}.mlp", mlp)


def _check_experts(checkpoint: dict[str, torch.Tensor], prefix: str, moe: SparseMoE) -> None:
    if f"{prefix}.experts.gate_up_proj" in checkpoint:  # transformers 5 stores them stacked
        assert torch.equal(moe.w13, checkpoint[f"{prefix}.experts.gate_up_proj"])
        assert torch.equal(moe.w2, checkpoint[f"{prefix}.experts.down_proj"])
        return
    for e in range(moe.num_experts):
        expert = f"{prefix}.experts.{e}"
        gate = checkpoint.get(f"{expert}.gate_proj.weight", checkpoint.get(f"{expert}.w1.weight"))
        up = checkpoint.get(f"{expert}.up_proj.weight", checkpoint.get(f"{expert}.w3.weight"))
        assert gate is not None
        assert up is not None
        assert torch.equal(moe.w13[e], torch.cat([gate, up]))


@pytest.mark.parametrize("name", ["qwen2-gqa-bias-tied", "qwen3-qk-norm", "llama-mqa"])
def test_the_fused_matmul_gives_each_projections_output(
        name: str, tiny_model: Callable[[str], Path]) -> None:
    """Split views of one matmul's output equal the three separate projections."""
    model, checkpoint = _load(tiny_model(name))
    attn = model.layers[0].self_attn
    x = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    for out, part in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")):
        weight = checkpoint[f"layers.0.self_attn.{part}.weight"]
        bias = checkpoint.get(f"layers.0.self_attn.{part}.bias")
        # The layers' own product (cpu_few_rows_linear: W @ x.T for few CPU rows), so
        # only the fusion is under test, not two summation orders.
        torch.testing.assert_close(out, cpu_few_rows_linear(x, weight, bias),
                                   rtol=1e-6, atol=1e-6)
