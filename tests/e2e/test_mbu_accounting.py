"""Decode-step MBU counts the bytes a step reads, not every parameter.

The input-embedding table is looked up (a few rows per step), not streamed; an LM head
tied to it streams it whole. Checked on tiny models on the CPU; and the stored H200 run,
recomputed this way, gives the batch-1 figure README quotes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers.benchmark_scripts import load_benchmark

from kvrelay_worker.models.factory import build_model
from kvrelay_worker.models.model_config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    return load_benchmark(name)


def _tiny(tied: bool) -> torch.nn.Module:
    config = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=64, tie_word_embeddings=tied)
    return build_model(config, None, torch.float32, torch.device("cpu"), max_position=64)


@pytest.mark.parametrize("tied", [False, True])
def test_weight_bytes_read_leaves_out_the_embedding_lookup(tied: bool) -> None:
    decode_step = _load("decode_step")
    model = _tiny(tied)
    all_bytes = sum(p.numel() * 4 for p in model.parameters())
    table = 1000 * 64 * 4
    batch = 3
    expected = all_bytes if tied else all_bytes - table + batch * 64 * 4
    assert decode_step.weight_bytes_read(model, batch) == expected


def test_stored_h200_run_recomputed() -> None:
    mbu = _load("mbu_from_json")
    rows = json.loads((ROOT / "benchmarks/measured/h200-decode-step.json").read_text())
    batch1 = mbu.recompute(rows["decode_step"])[0]
    assert batch1["batch"] == 1
    assert round(batch1["mbu_engine"], 3) == 0.685
    assert batch1["stored_mbu_engine"] > 0.73  # what the old accounting said
