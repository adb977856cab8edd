"""Decode steps on CPU in one native call (``cpu_kernels/decode_step.cpp``).

Op by op, a batch-1 step of a small model spends more time in Python and in dispatch
than in the kernels. The C++ step holds the layer stack (norms, projections as they are
kept, rotary tables) and runs it in one OpenMP region; the embedding lookup and the LM
head stay here. It takes the batches the per-op path would send to the same integer
kernels, so a quantized model gives the same bits either way; anything else (prefill
rows, verification, LoRA rows, a layer shape it does not know) runs op by op.

``KVRELAY_CPU_DECODE_STEP=0`` turns it off (``KVRELAY_KERNELS=reference`` does too). The
step holds the weight tensors it was built with: values written into them are seen, a
parameter given another tensor afterwards is not (``ModelRunner.prepare_decode`` again).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn

from kvrelay_kernels.backend import cpu_kernels_allowed
from kvrelay_kernels.cpu_quantized_matmul import integer_dot_serves
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_worker.engine.runner.host_batch import HostBatch
from kvrelay_worker.models.cpu_linear import Linear
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.decoder_layers import PreNormLayer
from kvrelay_worker.models.layers import GatedMLP
from kvrelay_worker.models.quantized_linear import FusedQuantizedLinear, QuantizedLinear

log = logging.getLogger(__name__)

# Rows a step of float32 weights takes (its own dot products, four rows per pass); larger
# batches keep the BLAS GEMM of the per-op path.
FLOAT_MAX_ROWS = 4


class Unsupported(Exception):
    """The model has something the native step does not run (the reason is the text)."""


Kept = QuantizedWeight | torch.Tensor


def _parts(linear: nn.Module) -> list[tuple[Kept, torch.Tensor | None]]:
    """A projection's runs of output columns (in the C++ step's order: q|k|v, o, gate|up,
    down): each a kept weight and its bias slice."""
    if isinstance(linear, QuantizedLinear):
        return [(linear.quantized, linear.bias)]
    if isinstance(linear, FusedQuantizedLinear):
        bias = linear.bias
        return [(part.quantized, None if bias is None else bias[start:stop])
                for part, (start, stop) in zip(linear.parts, linear.columns, strict=True)
                if isinstance(part, QuantizedLinear)]
    if isinstance(linear, nn.Linear) and type(linear) in (Linear, nn.Linear):
        return [(linear.weight, linear.bias)]
    raise Unsupported(f"a {type(linear).__name__} projection")


def _max_rows(weight: QuantizedWeight | torch.Tensor) -> int:
    """Most rows a part takes in the step: as many as the per-op path gives the same
    integer kernel (so the bits agree), or FLOAT_MAX_ROWS for float32."""
    if isinstance(weight, torch.Tensor):
        if weight.dtype != torch.float32:
            raise Unsupported(f"{weight.dtype} weights")
        return FLOAT_MAX_ROWS
    rows = 0
    while integer_dot_serves(rows + 1, weight):
        rows += 1
    if rows == 0:
        raise Unsupported(f"int{weight.bits} groups of {weight.group_size} over "
                          f"{weight.in_features} inputs")
    return rows


def _check_model(model: CausalLM) -> None:
    cfg = model.config
    if cfg.sandwich_norms or cfg.qk_norm or model.has_experts:
        raise Unsupported("sandwich norms, q/k norms or experts")
    if cfg.hidden_act != "silu":
        raise Unsupported(f"activation {cfg.hidden_act}")
    if cfg.norm_weight_offset:
        raise Unsupported("norm weight offset")
    for param in model.parameters():
        if param.device.type != "cpu" or (param.is_floating_point()
                                          and param.dtype != torch.float32):
            raise Unsupported("weights that are not float32 on the CPU")


class CpuDecodeRunner:
    """Runs pure decode steps of up to ``max_rows`` sequences through the C++ step."""

    def __init__(self, model: CausalLM, step: Any, max_rows: int) -> None:
        self.model = model
        self.step = step
        self.max_rows = max_rows
        self.attention = model.attention_layers()  # their caches are bound, and rebound, later

    @classmethod
    def build(cls, model: CausalLM) -> CpuDecodeRunner | None:
        """The runner for ``model``, or None (logged) where the step cannot serve it."""
        if os.environ.get("KVRELAY_CPU_DECODE_STEP", "1").strip() == "0":
            return None
        if not cpu_kernels_allowed():
            return None
        from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels

        if not load_cpu_kernels():
            return None
        try:
            _check_model(model)
            step, max_rows = cls._assemble(model)
        except Unsupported as exc:
            log.info("decode steps run op by op: the native step does not take %s", exc)
            return None
        log.info("decode steps of up to %d sequences run in one native call", max_rows)
        return cls(model, step, max_rows)

    @staticmethod
    def _assemble(model: CausalLM) -> tuple[Any, int]:
        cfg = model.config
        attn = model.attention_layers()[0]
        step = torch.classes.kvrelay_cpu.DecodeStep(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.rms_norm_eps, attn.scale)
        max_rows = 1 << 30
        for layer in model.decoder_layers():
            if not isinstance(layer, PreNormLayer) or not isinstance(layer.mlp, GatedMLP):
                raise Unsupported(f"a {type(layer).__name__} layer")
            self_attn = layer.self_attn
            window = self_attn.attn.sliding_window
            softcap = self_attn.attn.softcap
            step.add_layer(layer.input_layernorm.weight.data,
                           layer.post_attention_layernorm.weight.data,
                           self_attn.cos_sin_cache, 0 if window is None else int(window),
                           0.0 if softcap is None else float(softcap))
            projections = (self_attn.qkv_proj, self_attn.o_proj, layer.mlp.gate_up_proj,
                           layer.mlp.down_proj)
            for which, linear in enumerate(projections):
                for weight, bias in _parts(linear):
                    max_rows = min(max_rows, _max_rows(weight))
                    b = None if bias is None else bias.data.float().contiguous()
                    if isinstance(weight, QuantizedWeight):
                        step.add_part(which, weight.qweight, weight.scales.contiguous(),
                                      None if weight.mins is None else weight.mins.contiguous(),
                                      weight.bits, weight.group_size, b)
                    else:
                        step.add_part(which, weight.data.contiguous(), None, None, 32, 0, b)
        step.set_final_norm(model.norm.weight.data)
        return step, max_rows

    def handles(self, host: HostBatch) -> bool:
        """Whether ``host`` is a step it takes: one new token per sequence, few sequences,
        a float32 cache, no adapter rows."""
        return (host.is_decode_only and host.lora_slots is None
                and 0 < host.num_seqs <= self.max_rows
                and int(host.input_ids.shape[0]) == host.num_seqs
                and all(layer.kv_cache is not None and layer.kv_cache.dtype == torch.float32
                        for layer in self.attention))

    def run(self, host: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The step's logits (float32, one row per ``host.logits_indices``)."""
        model = self.model
        hidden = model.embed_tokens(host.input_ids if input_ids is None else input_ids)
        if model.config.embedding_multiplier is not None:
            hidden = hidden * torch.tensor(model.config.embedding_multiplier,
                                           dtype=hidden.dtype)
        caches = [layer.kv_cache for layer in self.attention]
        hidden = self.step.run(hidden.contiguous(), host.positions, caches, host.slot_mapping,
                               host.block_tables, host.seq_lens)
        return model.compute_logits(hidden[host.logits_indices]).float()
