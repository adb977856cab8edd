"""A decode step of a random-weight model at Llama-3-8B's shape, on CUDA.

Decode at small batch is bound by reading the weights (and the KV cache) once per step,
so the yardstick is model bandwidth utilisation: bytes read per step / step time / the
device's copy bandwidth measured in the same run. Bytes read are the weights a step
actually streams (every matrix, but of the input-embedding table only the batch's rows:
a lookup, not a read of 1.05 GB; an LM head tied to the embedding is read whole) plus
the KV cache of every context. Two step times are given:
``engine`` is a whole ``LLMEngine.step()`` (scheduling, input preparation, graph replay,
sampling, detokenisation: what a server sees), ``model`` is the CUDA-graph replay alone.
Needs CUDA; imports without it.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

LLAMA3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}


class NullTokenizer:
    """Random weights have no vocabulary worth reading: decoding costs nothing."""

    eos_token_id = None
    chat_template = None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 1000 for c in text]


def _build_engine(max_batch: int, max_model_len: int) -> Any:
    from kvrelay_worker.engine import EngineConfig, LLMEngine
    from kvrelay_worker.models.factory import build_model
    from kvrelay_worker.models.model_config import ModelConfig

    config = ModelConfig(**LLAMA3_8B)  # type: ignore[arg-type]
    model = build_model(config, None, torch.bfloat16, torch.device("cuda"),
                        max_position=max_model_len, random_init_std=0.02)
    engine_config = EngineConfig(model="llama3-8b-random", device="cuda", dtype="bfloat16",
                                 max_num_seqs=max_batch, max_model_len=max_model_len,
                                 max_num_batched_tokens=8192, gpu_memory_utilization=0.85,
                                 enable_prefix_caching=False)
    return LLMEngine.from_model(engine_config, model, NullTokenizer(), "llama3-8b-random")


def weight_bytes_read(model: Any, batch: int) -> int:
    """Weight bytes one decode step of ``batch`` sequences reads (see the module doc)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.embed_tokens.weight
    if model.lm_head.weight is embedding:  # tied: the LM head reads the whole table
        return int(total)
    row_bytes = embedding.shape[1] * embedding.element_size()
    return int(total - embedding.numel() * embedding.element_size() + batch * row_bytes)


def _time_model_replay(engine: Any, batch: int, replays: int = 20) -> float:
    runner = engine.runner.decode_runner
    bucket = runner._bucket(batch)
    graph = runner.graphs[bucket]
    times = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def run_decode_step_benchmark(copy_gbps: float, batches: Sequence[int] = (1, 16, 64),
                              context: int = 1024, steps: int = 24) -> list[dict[str, Any]]:
    from kvrelay_worker.engine import SamplingParams

    engine = _build_engine(max(batches), max_model_len=4096)
    model = engine.model
    cfg = model.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    rng = random.Random(0)
    rows = []
    for batch in batches:
        params = SamplingParams(max_tokens=steps + 16, temperature=0.0, ignore_eos=True)
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for request_id in ids:
            prompt = [rng.randrange(1000, 100000) for _ in range(context)]
            engine.add_request(request_id, prompt, params)
        # Prefill everything, then two warm-up decode steps.
        while engine.scheduler.num_waiting or any(
                s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
            engine.step()
        for _ in range(2):
            engine.step()
        assert engine.scheduler.num_running == batch, "not every sequence is decoding"
        torch.cuda.synchronize()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        model_s = _time_model_replay(engine, batch)
        avg_context = context + 2 + steps / 2
        kv_bytes = batch * avg_context * kv_per_token
        weight_bytes = weight_bytes_read(model, batch)
        moved = weight_bytes + kv_bytes
        rows.append({
            "batch": batch, "context": context, "weight_bytes_read": weight_bytes,
            "kv_bytes_per_step": kv_bytes, "engine_step_ms": step_s * 1e3,
            "model_replay_ms": model_s * 1e3,
            "tokens_per_s": batch / step_s,
            "mbu_engine": moved / step_s / (copy_gbps * 1e9),
            "mbu_model": moved / model_s / (copy_gbps * 1e9),
            "copy_gbps": copy_gbps,
        })
        for request_id in ids:
            engine.abort_request(request_id)
        engine.step()
    del engine
    torch.cuda.empty_cache()
    return rows


def format_decode_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'batch':>5} {'context':>7} {'step ms':>8} {'model ms':>9} {'tok/s':>9} "
             f"{'MBU step':>9} {'MBU model':>9}"]
    for r in rows:
        lines.append(f"{r['batch']:>5} {r['context']:>7} {r['engine_step_ms']:>8.2f} "
                     f"{r['model_replay_ms']:>9.2f} {r['tokens_per_s']:>9.0f} "
                     f"{r['mbu_engine']:>9.2f} {r['mbu_model']:>9.2f}")
    return "\n".join(lines)
