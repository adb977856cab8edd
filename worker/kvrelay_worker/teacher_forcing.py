"""Next-token logits at every position of a given token sequence (teacher forcing).

Comparing two models' greedy outputs token by token counts one early flip as a whole
continuation of differences; comparing their next-token predictions on the same sequence
does not. Quality benchmarks (perplexity, top-1 agreement) and quantization tests use it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence as Seq

import torch

from kvrelay_worker.engine.llm_engine import LLMEngine
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.scheduler_output import ScheduledSequence
from kvrelay_worker.engine.sched.sequence import Sequence


@torch.inference_mode()
def sequence_logits(engine: LLMEngine, token_ids: Seq[int]) -> torch.Tensor:
    """float32 ``[len(token_ids), vocab]``: row ``i`` predicts token ``i + 1``.

    One prefill in the engine's KV blocks 0..n; the engine must hold no request and have
    prefix caching off (the blocks are overwritten behind the block pool's back).
    """
    if engine.config.enable_prefix_caching or engine.has_unfinished_requests():
        raise ValueError("sequence_logits needs an idle engine with prefix caching off")
    runner = engine.runner
    blocks = -(-len(token_ids) // engine.config.block_size)
    if blocks > runner.num_blocks:
        raise ValueError(f"{len(token_ids)} tokens need {blocks} KV blocks; the engine "
                         f"has {runner.num_blocks}")
    seq = Sequence(request_id="teacher-forcing", choice_index=0, token_ids=list(token_ids),
                   num_prompt_tokens=len(token_ids), params=SamplingParams(max_tokens=1))
    seq.block_table = array("i", range(blocks))
    inputs = runner.to_device(runner.prepare_host([ScheduledSequence(seq, len(token_ids))]))
    hidden = runner.model(inputs.input_ids, inputs.positions, inputs.meta)
    return runner.model.compute_logits(hidden).float()
