"""Turns a scheduled batch into flat tensors and runs the model on them.

The batch is flattened with no padding: every scheduled sequence contributes its new
tokens back to back. The runner owns the KV cache tensors (one ``[2, blocks, block_size,
kv_heads, head_dim]`` tensor per layer) and binds them to the model's attention layers.
The LM head runs only on the last token of sequences that sample this step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from kvrelay_worker.engine.scheduler import ScheduledSequence
from kvrelay_worker.models.attention import AttentionMetadata
from kvrelay_worker.models.llama import LlamaForCausalLM


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    is_decode_only: bool


def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    cfg = model.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


class ModelRunner:
    """Runs one step of the model over a flattened batch, reading and writing the KV cache."""

    def __init__(self, model: LlamaForCausalLM, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.dtype = dtype
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        cfg = self.model.config
        shape = (2, num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
            layer.kv_cache = cache
        self.num_blocks = num_blocks

    def prepare(self, scheduled: Seq[ScheduledSequence]) -> ModelInputs:
        """Flatten the batch: per-sequence work in Python, per-token work in torch."""
        input_ids: list[int] = []
        starts: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        max_blocks = 0
        offset = 0
        for item in scheduled:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            starts.append(start)
            query_lens.append(n)
            seq_lens.append(start + n)
            offset += n
            if item.samples:
                logits_rows.append(offset - 1)
            max_blocks = max(max_blocks, len(seq.block_table))
        num_seqs = len(scheduled)
        tables = torch.zeros((num_seqs, max_blocks), dtype=torch.int32)
        for i, item in enumerate(scheduled):
            table = item.seq.block_table
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        q_lens = torch.tensor(query_lens, dtype=torch.int64)
        seq_index = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
        token_offsets = torch.arange(offset) - torch.repeat_interleave(
            torch.cumsum(q_lens, 0) - q_lens, q_lens
        )
        positions = torch.tensor(starts, dtype=torch.int64)[seq_index] + token_offsets
        blocks = tables[seq_index, positions // self.block_size].to(torch.int64)
        slot_mapping = blocks * self.block_size + positions % self.block_size
        query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int32)
        query_start_loc[1:] = torch.cumsum(q_lens, 0)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(slot_mapping),
            block_tables=self._to_device(tables),
            query_start_loc=self._to_device(query_start_loc),
            seq_lens=self._to_device(torch.tensor(seq_lens, dtype=torch.int32)),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
        )
        return ModelInputs(
            input_ids=self._to_device(torch.tensor(input_ids, dtype=torch.int64)),
            positions=self._to_device(positions),
            meta=meta,
            logits_indices=self._to_device(torch.tensor(logits_rows, dtype=torch.int64)),
            is_decode_only=all(n == 1 for n in query_lens),
        )

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def execute(self, scheduled: Seq[ScheduledSequence]) -> torch.Tensor:
        """Run the batch; return logits ``[num_sampling_seqs, vocab]`` in float32."""
        inputs = self.prepare(scheduled)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        if inputs.logits_indices.numel() == 0:
            return torch.empty((0, self.model.config.vocab_size), device=self.device)
        return self.model.compute_logits(hidden[inputs.logits_indices]).float()

    # ----------------------------------------------------------------- profiling

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, num_seqs: int) -> None:
        """A throwaway forward pass at full batch size, to measure peak activation memory."""
        from kvrelay_worker.engine.sampling_params import SamplingParams
        from kvrelay_worker.engine.sequence import Sequence

        cfg = self.model.config
        per_seq = max(1, min(num_tokens, cfg.max_position_embeddings))
        num_dummy = max(1, -(-num_tokens // per_seq))
        blocks_per_seq = -(-per_seq // self.block_size)
        saved = (self.kv_caches, self.num_blocks)
        self.allocate_kv_cache(blocks_per_seq * num_dummy)
        scheduled = []
        params = SamplingParams(max_tokens=1)
        for i in range(num_dummy):
            seq = Sequence(request_id=f"profile-{i}", choice_index=0, token_ids=[0] * per_seq,
                           num_prompt_tokens=per_seq, params=params)
            seq.block_table = list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
            scheduled.append(ScheduledSequence(seq, per_seq))
        hidden_logits = self.execute(scheduled)
        rows = min(num_seqs, num_tokens)
        logits = self.model.compute_logits(
            torch.zeros((rows, cfg.hidden_size), dtype=self.dtype, device=self.device)
        ).float()
        logits.sort(dim=-1, descending=True)
        logits.softmax(dim=-1).cumsum(dim=-1)
        del hidden_logits, logits
        self.kv_caches, self.num_blocks = saved
        if self.kv_caches:
            for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
                layer.kv_cache = cache

    def prepare_graphs(self, config: object, max_model_len: int) -> None:
        """Capture CUDA graphs for decode (GPU only; see ``cuda_graphs``)."""
        self.max_model_len = max_model_len
