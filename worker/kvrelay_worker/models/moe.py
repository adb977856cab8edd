"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router picks each token's top-k experts.

Expert weights are stacked (``w13``: every expert's gate and up rows, ``w2``: its down
projection) so one grouped matmul serves all experts: the (token, expert) pairs are sorted
by expert and ``grouped_mm`` multiplies each expert's run of rows by that expert's matrix
in a single call, instead of a Python loop issuing two matmuls per expert hit. Where
``grouped_mm`` cannot run (CUDA before Hopper, or not bfloat16), two paths remain:

- ``_padded``: every expert's rows scattered into a ``[experts, tokens, hidden]`` batch
  (an expert gets each token at most once) and two batched matmuls, all on the device:
  no read-back. It multiplies ``experts / top_k`` times the rows, but reads every
  expert's weights once, as the loop does when most experts are hit; so it serves a step
  with at least as many (token, expert) pairs as experts.
- ``_loop``: one pair of matmuls per expert hit, which must read the counts back (one
  wait for the device per layer) but reads only those experts' weights: small batches.
  It is also the baseline the MoE benchmark compares against.

Experts kept quantized (a GGUF's blocks, ``keep_quantized``) are one ``QuantizedLinear``
pair per expert instead of the stacks, and always take ``_loop``: the quantized kernels
multiply one matrix at a time, and the loop reads only the experts a step hits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvrelay_worker.engine.runner.device_capability import grouped_mm_supported
from kvrelay_worker.models.layers import activation
from kvrelay_worker.models.model_config import ModelConfig

_grouped_mm = getattr(F, "grouped_mm", None)


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden = config.num_experts, config.hidden_size
        self.intermediate_size = config.moe_intermediate_size
        self.top_k = config.num_experts_per_tok
        self.num_experts = experts
        self.normalize_top_k = config.norm_topk_prob
        self.act = activation(config.hidden_act)
        # Named like Hugging Face's router (``mlp.gate.weight``) so checkpoints map directly.
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(experts, 2 * self.intermediate_size, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, self.intermediate_size))
        self.grouped = _grouped_mm is not None
        # Without grouped_mm, large steps take the padded batch (no read-back per layer).
        self.padded = True
        # Per-expert quantized (gate|up) and down projections, in place of w13/w2.
        self.quantized_w13: nn.ModuleList | None = None
        self.quantized_w2: nn.ModuleList | None = None

    def keep_quantized(self, w13: list[nn.Module], w2: list[nn.Module]) -> None:
        """Run on per-expert quantized modules; the float stacks are dropped."""
        if len(w13) != self.num_experts or len(w2) != self.num_experts:
            raise ValueError(f"{len(w13)}/{len(w2)} quantized experts for {self.num_experts}")
        for name in ("w13", "w2"):
            if name in self._parameters:
                del self._parameters[name]
        self.quantized_w13 = nn.ModuleList(w13)
        self.quantized_w2 = nn.ModuleList(w2)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights, experts)``, each ``[tokens, top_k]``, as transformers computes them."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        flat_experts = experts.reshape(-1)
        order = flat_experts.argsort(stable=True)
        token_of_row = order // self.top_k
        rows = x.index_select(0, token_of_row)
        # Not bincount: on CUDA it reads the largest id back to size its output.
        counts = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, flat_experts, torch.ones_like(flat_experts))
        if self.quantized_w13 is not None:
            out = self._loop(rows, counts)
        elif self.grouped and (x.device.type == "cpu" or (
                x.dtype == torch.bfloat16 and grouped_mm_supported(x.device))):
            # CUDA's grouped_mm takes bfloat16 only, from Hopper on; else the loop.
            out = self._grouped(rows, counts)
        elif self.padded and x.shape[0] * self.top_k >= self.num_experts:
            out = self._padded(rows, flat_experts[order], counts, x.shape[0])
        else:
            out = self._loop(rows, counts)
        out = out * weights.reshape(-1)[order, None]
        final = torch.zeros_like(x)
        final.index_add_(0, token_of_row, out)
        return final

    def _grouped(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if _grouped_mm is None:
            raise RuntimeError("this torch has no grouped_mm")
        offsets = counts.cumsum(0).to(torch.int32)
        gate_up = _grouped_mm(rows, self.w13.transpose(1, 2), offs=offsets)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        result: torch.Tensor = _grouped_mm(self.act(gate) * up, self.w2.transpose(1, 2),
                                           offs=offsets)
        return result

    def _padded(self, rows: torch.Tensor, expert_of_row: torch.Tensor, counts: torch.Tensor,
                tokens: int) -> torch.Tensor:
        """Rows sorted by expert, as one ``[experts, tokens, hidden]`` batch: each row goes
        to its expert's slot at its rank among that expert's rows. No value is read back."""
        starts = counts.cumsum(0) - counts
        rank = torch.arange(rows.shape[0], device=rows.device) - starts[expert_of_row]
        batch = rows.new_zeros(self.num_experts, tokens, rows.shape[1])
        batch[expert_of_row, rank] = rows
        gate, up = torch.bmm(batch, self.w13.transpose(1, 2)).split(self.intermediate_size,
                                                                    dim=-1)
        result = torch.bmm(self.act(gate) * up, self.w2.transpose(1, 2))
        out: torch.Tensor = result[expert_of_row, rank]
        return out

    def _loop(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """One pair of matmuls per expert that got tokens: the per-expert baseline."""
        out = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts.tolist()):
            if count == 0:
                continue
            chunk = rows[start : start + count]
            if self.quantized_w13 is not None and self.quantized_w2 is not None:
                gate, up = self.quantized_w13[expert](chunk).split(self.intermediate_size, -1)
                out[start : start + count] = self.quantized_w2[expert](self.act(gate) * up)
            else:
                gate, up = F.linear(chunk, self.w13[expert]).split(self.intermediate_size,
                                                                   dim=-1)
                out[start : start + count] = F.linear(self.act(gate) * up, self.w2[expert])
            start += count
        return out
