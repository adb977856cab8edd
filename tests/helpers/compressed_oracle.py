"""compressed-tensors' own decompression: the oracle of the kept-quantized checkpoints.

Per layer, the compressor the checkpoint names (``decompress``); for the model,
transformers loading the folder with ``run_compressed=False`` (``decompress_model``: plain
float32 ``Linear`` layers, no activation quantization).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

# The parity prompts the kept-quantized checkpoints are compared on.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "import numpy as np\nx = np.",
    "The largest planet in the solar system is",
]


def oracle_scheme(folder: Path) -> tuple[object, object]:
    """The compressor of the checkpoint's (first) config group, and its weight scheme."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    group = next(iter(config["config_groups"].values()))
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])
    return BaseCompressor.load_from_registry(group["format"]), scheme


def decompressed_model(folder: Path) -> PreTrainedModel:
    """transformers' float32 model of the checkpoint, every weight decompressed."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32,
        quantization_config=CompressedTensorsConfig(run_compressed=False))
    return model.eval()
