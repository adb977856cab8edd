"""The engine's parts, sized and wired around one model: what ``LLMEngine`` steps with.

The order matters: the draft's weights load before the KV pool is sized (the pool's
budget pays for them and for the draft's own pool), and the longest sequence is settled
only once the pool's size is known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from kvrelay_worker.engine.config import EngineConfig
from kvrelay_worker.engine.engine_model import draft_weights, eos_token_ids_of
from kvrelay_worker.engine.input_processor import InputProcessor
from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.kv.kv_sizing import decide_num_blocks, decide_num_swap_blocks
from kvrelay_worker.engine.kv.kv_swap import allocate_host_kv
from kvrelay_worker.engine.kv.max_model_len import fit_max_model_len
from kvrelay_worker.engine.kv.swap_space import SwapSpace
from kvrelay_worker.engine.lora.lora_manager import LoraManager
from kvrelay_worker.engine.runner.model_runner import ModelRunner, kv_bytes_per_block
from kvrelay_worker.engine.sample.sampler import Sampler
from kvrelay_worker.engine.sample.sampling_batch import SamplingBatchBuilder
from kvrelay_worker.engine.sample.stop_conditions import StopConditions
from kvrelay_worker.engine.sched.preemption import PreemptionPolicy, SwapCostModel, preemption_mode
from kvrelay_worker.engine.sched.prefill_pacing import PrefillPacer
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.step_timer import StepTimer
from kvrelay_worker.engine.spec.draft_model import DraftModel
from kvrelay_worker.engine.spec.speculator import Speculator
from kvrelay_worker.models.decoder import CausalLM
from kvrelay_worker.models.quantize_model import weight_bytes

log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    eos_token_ids: tuple[int, ...]
    runner: ModelRunner
    step_timer: StepTimer
    weight_bytes: int
    max_model_len: int
    kv: KVCacheManager
    host_kv_caches: list[torch.Tensor]  # the swap pool's tensors; empty without one
    scheduler: Scheduler
    sampler: Sampler
    sampling_batches: SamplingBatchBuilder
    speculator: Speculator | None
    inputs: InputProcessor
    loras: LoraManager | None  # None: LoRA is off (``max_loras`` 0)


def build_engine_parts(config: EngineConfig, model: CausalLM, tokenizer: Any,
                       model_id: str, draft_model: CausalLM | None = None) -> EngineParts:
    """Every part around ``model``; the caller has bound ``config``'s device already."""
    device = config.torch_device
    vocab_size = model.config.vocab_size
    eos_token_ids = eos_token_ids_of(model, tokenizer)
    # Before the runner: the adapter slots are allocated with the weights, and the
    # KV pool is sized around both.
    loras = (LoraManager(model, config.max_loras, config.max_lora_rank, config.torch_dtype,
                         device) if config.max_loras else None)
    runner = ModelRunner(model, config.block_size, device, config.torch_dtype,
                         config.torch_kv_cache_dtype)
    runner.lora = loras.batch if loras is not None else None
    step_timer = StepTimer.for_device(device)
    model_bytes = weight_bytes(model)
    draft_model = draft_weights(config, model, draft_model)
    draft_per_block = (0 if draft_model is None else kv_bytes_per_block(
        draft_model, config.block_size, config.torch_kv_cache_dtype))
    num_blocks = decide_num_blocks(config, runner, draft_per_block)
    max_len = fit_max_model_len(config, model.config.max_position_embeddings,
                                model.config.kv_window, num_blocks)
    runner.allocate_kv_cache(num_blocks)
    log.info("KV cache: %d blocks of %d tokens, %s (kv_cache_dtype=%s), %.1f MiB",
             num_blocks, config.block_size, config.torch_kv_cache_dtype,
             config.kv_cache_dtype, num_blocks * kv_bytes_per_block(
                 model, config.block_size, config.torch_kv_cache_dtype) / 2**20)
    runner.prepare_decode(min(config.max_num_seqs, config.cuda_graph_max_batch),
                          max_len, config.enable_cuda_graphs)
    kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching,
                        model_id, sliding_window=model.config.kv_window)
    swap, policy, host_kv_caches = _swap_setup(config, model, runner)
    stop = StopConditions(frozenset(eos_token_ids), max_len)
    scheduler = Scheduler(kv, config.max_num_seqs, config.max_num_batched_tokens,
                          config.enable_chunked_prefill, stop, swap=swap, preemption=policy,
                          pacer=_pacer(config), max_loras=config.max_loras)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    return EngineParts(
        eos_token_ids=eos_token_ids, runner=runner, step_timer=step_timer,
        weight_bytes=model_bytes, max_model_len=max_len, kv=kv,
        host_kv_caches=host_kv_caches, scheduler=scheduler, sampler=Sampler(generator),
        sampling_batches=SamplingBatchBuilder(vocab_size, eos_token_ids, device),
        speculator=_speculator(config, max_len, vocab_size, num_blocks, draft_model),
        inputs=InputProcessor(tokenizer, vocab_size, eos_token_ids, max_len, device, stop),
        loras=loras,
    )


def _speculator(config: EngineConfig, max_len: int, vocab_size: int, num_blocks: int,
                draft_model: CausalLM | None) -> Speculator | None:
    method = config.speculative_method
    if method == "off":
        return None
    draft = None
    if method == "draft":
        assert draft_model is not None, "loaded by draft_weights"
        name = config.speculative_draft_model or "draft"
        draft = DraftModel.of_model(draft_model, config, vocab_size, num_blocks, name)
    return Speculator(max_drafts=config.num_speculative_tokens,
                      ngram_min=config.speculative_ngram_min,
                      ngram_max=config.speculative_ngram_max,
                      max_model_len=max_len, draft=draft,
                      adaptive=config.speculative_adaptive)


def _pacer(config: EngineConfig) -> PrefillPacer | None:
    if config.target_step_ms is None:
        return None
    return PrefillPacer(config.target_step_ms,
                        min(config.min_prefill_chunk, config.max_num_batched_tokens))


def _swap_setup(config: EngineConfig, model: CausalLM, runner: ModelRunner
                ) -> tuple[SwapSpace | None, PreemptionPolicy, list[torch.Tensor]]:
    """The host pool (bookkeeping and tensors) and the preemption policy."""
    mode = preemption_mode(config.preemption_mode)
    num_host_blocks = decide_num_swap_blocks(config, runner)
    if num_host_blocks < 1:
        return None, PreemptionPolicy("recompute"), []
    host_kv_caches = allocate_host_kv(runner.kv_caches, num_host_blocks)
    per_block = kv_bytes_per_block(model, config.block_size, config.torch_kv_cache_dtype)
    num_params = sum(p.numel() for p in model.parameters())
    cost = SwapCostModel.estimate(num_params, per_block, config.torch_device)
    return SwapSpace(num_host_blocks), PreemptionPolicy(mode, cost), host_kv_caches
