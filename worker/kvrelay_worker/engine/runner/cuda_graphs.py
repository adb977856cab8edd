"""Decode steps on CUDA at fixed, padded shapes, replayed from captured CUDA graphs.

A decode step is dozens of small kernels per layer; launching them one by one from
Python costs more than running them at small batch sizes. Capturing the whole forward
pass (and the LM head) once per padded batch size and replaying it removes that cost.

Every decode batch is padded up to the nearest captured size and the attention kernel is
always planned for ``max_model_len``, whether the graph is replayed or the same shapes
run eagerly (``enable_cuda_graphs=False``): the two then do exactly the same arithmetic
and give identical tokens. Padding rows write nowhere (slot -1) and their logits are
dropped.

"One token per sequence" is not quite "decode": a prompt still being prefilled gets a
1-token chunk when only one token of budget is left. That row runs here like the others
(its K/V must be written) but samples nothing, so ``run`` returns the logits of the
sampling rows only (``HostBatch.logits_indices``), as the eager path does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from kvrelay_worker.engine.runner.host_batch import HostBatch
from kvrelay_worker.engine.runner.staging import Fence, StagingBuffer
from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.models.attention import AttentionMetadata
from kvrelay_worker.models.decoder import CausalLM

log = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then every multiple of 16 up to ``max_batch``."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeRunner:
    def __init__(self, model: CausalLM, max_batch: int, max_model_len: int,
                 block_size: int, device: torch.device,
                 new_fence: Callable[[], Fence] | None = None) -> None:
        self.model = model
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self.buckets = batch_buckets(max_batch)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.runs_by_bucket: dict[int, int] = {}
        max_blocks = -(-max_model_len // block_size)
        self.device = device
        # Per-token inputs live in one [4, max_batch] tensor (ids, positions, slots, lengths)
        # so a step moves them with one copy from a pinned host buffer; block tables too,
        # as many rows and columns as the step has (``[:n, :width]``), not the whole table.
        self._packed = torch.zeros((4, max_batch), dtype=torch.int64, device=device)
        self._packed[2].fill_(-1)
        self._packed[3].fill_(1)
        self.block_tables = torch.zeros((max_batch, max_blocks), dtype=torch.int32, device=device)
        self._staged_packed = StagingBuffer(4 * max_batch, torch.int64, device, new_fence)
        self._staged_tables = StagingBuffer(max_batch * max_blocks, torch.int32, device,
                                            new_fence)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.logits = torch.zeros((max_batch, model.config.vocab_size), dtype=torch.float32,
                                  device=device)

    def handles(self, host: HostBatch) -> bool:
        return host.is_decode_only and 0 < host.num_seqs <= self.max_batch

    def _bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _forward(self, batch: int) -> None:
        packed = self._packed[:, :batch]
        meta = AttentionMetadata(
            slot_mapping=packed[2],
            block_tables=self.block_tables[:batch],
            query_start_loc=self.query_start_loc[: batch + 1],
            seq_lens=packed[3].to(torch.int32),
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )
        hidden = self.model(packed[0], packed[1], meta)
        self.logits[:batch].copy_(self.model.compute_logits(hidden))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first, all sharing one memory pool."""
        # The engine thread has set this device current already (engine/runner/device.py); saying
        # it again here keeps the pool and the stream on it whoever calls.
        with torch.cuda.device(self.device):
            self._capture_all()
        log.info("captured decode CUDA graphs for batch sizes %s", self.buckets)

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for batch in reversed(self.buckets):
                self._forward(batch)  # warm-up: compiles kernels, sets up cuBLAS
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self._forward(batch)
                self.graphs[batch] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    @torch.inference_mode()
    def run(self, host: HostBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Run the step; return logits ``[num_sampling_seqs, vocab]`` (float32).

        ``input_ids`` (on the device) replaces the host batch's ids, as in
        ``ModelRunner.execute``."""
        n = host.num_seqs
        batch = self._bucket(n)
        # Each buffer waits here for its previous copy to the device to have run.
        staged_packed = self._staged_packed.writable((4, self.max_batch))
        staged = staged_packed.numpy()
        staged[0, :n] = host.input_ids.numpy()
        staged[1, :n] = host.positions.numpy()
        staged[2, :n] = host.slot_mapping.numpy()
        staged[2, n:batch] = -1
        staged[3, :n] = host.seq_lens.numpy()
        staged[3, n:batch] = 1
        width = host.block_tables.shape[1]
        staged_tables = self._staged_tables.writable((n, width))
        staged_tables.numpy()[:] = host.block_tables.numpy()
        self._staged_packed.copy_to(self._packed, staged_packed)
        # Columns past ``width`` keep older entries; no sequence of this step reads them.
        self._staged_tables.copy_to(self.block_tables[:n, :width], staged_tables)
        if input_ids is not None:  # queued after the staged copy: it overwrites its ids
            self._packed[0, :n].copy_(input_ids)
        self.runs_by_bucket[batch] = self.runs_by_bucket.get(batch, 0) + 1
        graph = self.graphs.get(batch)
        if graph is not None:
            graph.replay()
        else:
            self._forward(batch)
        rows = host.logits_indices
        if rows.numel() == n:  # every row samples (one token each: rows are 0..n-1)
            return self.logits[:n]
        return self.logits.index_select(0, host_to_device(rows, self.logits.device))
