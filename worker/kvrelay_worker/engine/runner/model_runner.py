"""Turns a scheduled batch into flat tensors and runs the model on them.

The batch is flattened with no padding: every scheduled sequence contributes its new
tokens back to back. The runner owns the KV cache tensors (one ``[2, blocks, block_size,
kv_heads, head_dim]`` tensor per layer) and binds them to the model's attention layers.
The LM head runs only on the batch's sampling rows (``BatchLayout``): the last token of
each sequence that samples this step, and the positions of the drafts it verifies.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from kvrelay_kernels.kv_quant import kv_row_size
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.runner.cpu_decode import CpuDecodeRunner
from kvrelay_worker.engine.runner.cuda_graphs import DecodeRunner
from kvrelay_worker.engine.runner.host_batch import HostBatch
from kvrelay_worker.engine.runner.prompt_scoring import PromptScores, score_prompt_spans
from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.engine.sched.scheduler_output import BatchLayout, ScheduledSequence
from kvrelay_worker.models.attention import AttentionMetadata
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.lora_linear import LoraBatch


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


log = logging.getLogger(__name__)

def kv_bytes_per_block(model: CausalLM, block_size: int, kv_dtype: torch.dtype) -> int:
    """Bytes of one block over all layers, K and V, in a cache of ``kv_dtype`` (a quantized
    cache's rows include their scale byte)."""
    cfg = model.config
    row = kv_row_size(cfg.head_dim, kv_dtype)
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * row
    return per_token * block_size * torch.empty((), dtype=kv_dtype).element_size()


class ModelRunner:
    """Runs one step of the model over a flattened batch, reading and writing the KV cache."""

    def __init__(self, model: CausalLM, block_size: int, device: torch.device,
                 dtype: torch.dtype, kv_cache_dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.dtype = dtype
        # The cache tensors' dtype: the model's, or int8 / float8 (quantized rows).
        self.kv_cache_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        # Pure decode steps it takes skip the per-op forward (CUDA graphs, or the native
        # CPU step); set by ``prepare_decode``.
        self.decode_runner: DecodeRunner | CpuDecodeRunner | None = None
        # The model's LoRA linears read each step's adapter rows here (None: no LoRA).
        self.lora: LoraBatch | None = None
        if device.type == "cuda":
            self._check_kernels_fit()

    def _check_kernels_fit(self) -> None:
        """Fail at start, with the reason, if the attention kernels cannot run here."""
        from kvrelay_kernels import KernelArgumentError
        from kvrelay_kernels.triton_kernels.launch_config import check_attention_fits

        cfg = self.model.config
        try:
            check_attention_fits(num_heads=cfg.num_attention_heads,
                                 num_kv_heads=cfg.num_key_value_heads, head_size=cfg.head_dim,
                                 block_size=self.block_size, dtype=self.dtype,
                                 device=self.device)
        except KernelArgumentError as exc:
            raise EngineConfigError(f"{exc} (device {self.device})") from exc

    def allocate_kv_cache(self, num_blocks: int) -> None:
        cfg = self.model.config
        row = kv_row_size(cfg.head_dim, self.kv_cache_dtype)
        shape = (2, num_blocks, self.block_size, cfg.num_key_value_heads, row)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
            layer.kv_cache = cache
        self.num_blocks = num_blocks

    def prepare_host(self, scheduled: Seq[ScheduledSequence],
                     layout: BatchLayout | None = None) -> HostBatch:
        """Flatten the batch: per-sequence work in Python, per-token work in numpy.

        numpy rather than torch here: each call costs about a microsecond instead of ten,
        and this runs on the host between two forward passes, every step. ``layout`` is
        the batch's (the scheduler's), worked out here when the caller has none.
        """
        if layout is None:
            layout = BatchLayout.of(list(scheduled))
        num_seqs = len(scheduled)
        starts = np.empty(num_seqs, dtype=np.int64)
        query_lens = np.empty(num_seqs, dtype=np.int64)
        max_blocks = max((len(item.seq.block_table) for item in scheduled), default=0)
        tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        input_ids: list[int] = []
        offset = 0
        for i, item in enumerate(scheduled):
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            starts[i] = start
            query_lens[i] = n
            table = seq.block_table
            tables[i, : len(table)] = table
            drafts = item.drafts
            if n == 1:
                input_ids.append(seq.token_ids[start])
            elif drafts:  # the real next token, then the drafts to verify
                input_ids.extend(seq.token_ids[start : start + n - len(drafts)])
                input_ids.extend(drafts)
            else:
                input_ids.extend(seq.token_ids[start : start + n])
            offset += n
        seq_lens = starts + query_lens
        ends = np.cumsum(query_lens)
        if offset == num_seqs:  # pure decode: one token per sequence
            seq_index = np.arange(num_seqs)
            positions = starts
        else:
            seq_index = np.repeat(np.arange(num_seqs), query_lens)
            positions = starts[seq_index] + (np.arange(offset) - (ends - query_lens)[seq_index])
        bs = self.block_size
        slot_mapping = tables[seq_index, positions // bs].astype(np.int64) * bs + positions % bs
        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int32)
        query_start_loc[1:] = ends
        return HostBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)),
            slot_mapping=torch.from_numpy(slot_mapping),
            block_tables=torch.from_numpy(tables),
            query_start_loc=torch.from_numpy(query_start_loc),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
            logits_indices=torch.tensor(layout.token_indices, dtype=torch.int64),
            max_query_len=int(query_lens.max()) if num_seqs else 0,
            max_seq_len=int(seq_lens.max()) if num_seqs else 0,
            lora_slots=self._lora_slots(scheduled, query_lens),
        )

    def _lora_slots(self, scheduled: Seq[ScheduledSequence], query_lens: np.ndarray
                    ) -> torch.Tensor | None:
        """Each token's adapter slot, or None when no sequence of the batch has one (the
        LoRA linears then cost nothing). Forgets the previous step's rows first."""
        if self.lora is None:
            return None
        self.lora.clear()
        slots = [-1 if item.seq.lora is None else item.seq.lora.slot for item in scheduled]
        if all(slot == -1 for slot in slots):
            return None
        if None in slots:
            raise RuntimeError("a scheduled sequence's LoRA adapter has no device slot")
        return torch.from_numpy(np.repeat(np.asarray(slots, dtype=np.int64), query_lens))

    def to_device(self, host: HostBatch) -> ModelInputs:
        if self.lora is not None and host.lora_slots is not None:
            self.lora.bind(self._to_device(host.lora_slots), host.lora_slots)
        meta = AttentionMetadata(
            slot_mapping=self._to_device(host.slot_mapping),
            block_tables=self._to_device(host.block_tables),
            query_start_loc=self._to_device(host.query_start_loc),
            seq_lens=self._to_device(host.seq_lens),
            max_query_len=host.max_query_len,
            max_seq_len=host.max_seq_len,
        )
        return ModelInputs(
            input_ids=self._to_device(host.input_ids),
            positions=self._to_device(host.positions),
            meta=meta,
            logits_indices=self._to_device(host.logits_indices),
        )

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return host_to_device(t, self.device)

    @torch.inference_mode()
    def execute(self, scheduled: Seq[ScheduledSequence],
                input_ids: torch.Tensor | None = None, *,
                layout: BatchLayout | None = None) -> torch.Tensor:
        """Run the batch; return logits ``[layout.num_rows, vocab]`` in float32: one row
        per sampling sequence, plus one per draft token of a sequence verifying drafts.

        ``input_ids``, a device tensor of the batch's token count, replaces the ids the
        sequences hold on the host (a draft model feeds its own guesses back without
        reading them: those host ids are then placeholders).
        """
        host = self.prepare_host(scheduled, layout)
        if (self.decode_runner is not None and host.lora_slots is None
                and self.decode_runner.handles(host)):  # neither holds adapter rows
            return self.decode_runner.run(host, input_ids)
        inputs = self.to_device(host)
        if input_ids is not None:
            inputs.input_ids = input_ids
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        return self._sampling_logits(hidden, inputs)

    @torch.inference_mode()
    def execute_scoring(self, layout: BatchLayout) -> tuple[torch.Tensor, list[PromptScores]]:
        """``execute``, plus the log-probabilities of ``layout.prompt_spans``' prompt
        positions (always eager: the scored rows need every hidden state of the chunk)."""
        inputs = self.to_device(self.prepare_host(layout.scheduled, layout))
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        scores = score_prompt_spans(self.model, hidden, layout.prompt_spans)
        return self._sampling_logits(hidden, inputs), scores

    def _sampling_logits(self, hidden: torch.Tensor, inputs: ModelInputs) -> torch.Tensor:
        if inputs.logits_indices.numel() == 0:
            return torch.empty((0, self.model.config.vocab_size), device=self.device)
        return self.model.compute_logits(hidden[inputs.logits_indices]).float()

    # ----------------------------------------------------------------- profiling

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, num_seqs: int) -> None:
        """A throwaway forward pass at full batch size, to measure peak activation memory."""
        from kvrelay_worker.engine.sampling_params import SamplingParams
        from kvrelay_worker.engine.sched.sequence import Sequence

        cfg = self.model.config
        per_seq = max(1, min(num_tokens, self.model.max_position))
        num_dummy = max(1, -(-num_tokens // per_seq))
        blocks_per_seq = -(-per_seq // self.block_size)
        saved = (self.kv_caches, self.num_blocks)
        self.allocate_kv_cache(blocks_per_seq * num_dummy)
        scheduled = []
        params = SamplingParams(max_tokens=1)
        for i in range(num_dummy):
            seq = Sequence(request_id=f"profile-{i}", choice_index=0, token_ids=[0] * per_seq,
                           num_prompt_tokens=per_seq, params=params)
            seq.block_table = array("i", range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
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
        for i, layer in enumerate(self.model.attention_layers()):
            layer.kv_cache = self.kv_caches[i] if self.kv_caches else None

    def prepare_decode(self, max_batch: int, max_model_len: int, use_graphs: bool) -> None:
        """On CUDA, run decode steps at fixed padded shapes (captured as graphs if asked);
        on CPU, in one native call where the model allows (``cpu_decode.py``)."""
        if self.device.type == "cpu":
            self.decode_runner = CpuDecodeRunner.build(self.model)
            return
        if self.device.type != "cuda":
            return
        self.decode_runner = DecodeRunner(self.model, max_batch, max_model_len,
                                          self.block_size, self.device)
        if use_graphs and self.model.has_experts:
            # Routing sizes each expert's share of the batch on the host (the per-expert
            # loop) or needs grouped_mm's bfloat16-only CUDA path: not captured, for now.
            log.info("CUDA graphs off: mixture-of-experts layers decode eagerly")
        elif use_graphs:
            self.decode_runner.capture()
