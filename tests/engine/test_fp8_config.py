"""Which compressed-tensors float schemes the engine keeps (FP8) and which it refuses.

The configs are the ``quantization_config`` llmcompressor 0.14 writes for its presets
(read from its output in ``test_fp8_checkpoints``); here each field is varied alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvrelay_worker.loading.prequantized_config import Fp8Scheme, checkpoint_scheme
from kvrelay_worker.models.errors import UnsupportedModelError

FP8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "actorder": None}
PER_TOKEN = {**FP8, "strategy": "token", "dynamic": True}
PER_TENSOR = {**FP8, "strategy": "tensor", "observer": "static_minmax"}
PER_GROUP = {**FP8, "strategy": "group", "group_size": 128, "dynamic": True}
BLOCKS = {**FP8, "strategy": "block", "block_structure": [128, 128]}


def config(weights: dict[str, Any], inputs: dict[str, Any] | None = None,
           fmt: str = "float-quantized") -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": fmt,
            "quantization_status": "compressed", "sparsity_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs, "format": fmt}}}


@pytest.mark.parametrize(
    ("weights", "inputs", "fmt", "expected"),
    [
        ({**FP8, "strategy": "channel"}, PER_TOKEN, "float-quantized",  # FP8_DYNAMIC
         Fp8Scheme("channel", None, "dynamic")),
        ({**FP8, "strategy": "tensor"}, PER_TENSOR, "float-quantized",  # FP8
         Fp8Scheme("tensor", None, "static")),
        (BLOCKS, PER_GROUP, "float-quantized", Fp8Scheme("block", (128, 128), "dynamic")),
        ({**FP8, "strategy": "channel"}, None, "naive-quantized",  # weight-only FP8
         Fp8Scheme("channel", None, "none", "naive-quantized")),
    ],
)
def test_fp8_schemes_are_kept(weights: dict[str, Any], inputs: dict[str, Any] | None,
                              fmt: str, expected: Fp8Scheme) -> None:
    assert checkpoint_scheme(config(weights, inputs, fmt), "config.json") == expected
    assert expected.describe().startswith("fp8 e4m3")


@pytest.mark.parametrize(
    ("weights", "inputs", "fmt", "match"),
    [
        ({**FP8, "num_bits": 4, "strategy": "tensor_group", "group_size": 16}, None,
         "nvfp4-pack-quantized", "4-bit float weights.*NVFP4"),
        ({**FP8, "num_bits": 4, "strategy": "group", "group_size": 32}, None,
         "mxfp4-pack-quantized", "4-bit float weights.*MXFP4"),
        ({**FP8, "strategy": "group", "group_size": 128}, None, "float-quantized",
         "'group' strategy"),
        ({**FP8, "strategy": "channel", "symmetric": False}, None, "float-quantized",
         "asymmetric"),
        ({**FP8, "strategy": "channel"}, {**PER_TOKEN, "type": "int"}, "float-quantized",
         "8-bit int"),
        ({**FP8, "strategy": "channel"}, {**PER_TENSOR, "dynamic": True}, "float-quantized",
         "'tensor' activation"),
        ({**FP8, "strategy": "channel"}, PER_GROUP, "float-quantized",  # groups: blocks only
         "'group' activation"),
    ],
)
def test_other_float_schemes_are_refused(weights: dict[str, Any],
                                         inputs: dict[str, Any] | None, fmt: str,
                                         match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match) as info:
        checkpoint_scheme(config(weights, inputs, fmt), "config.json")
    assert "supported pre-quantized checkpoints" in str(info.value)


def test_output_activations_are_refused() -> None:
    quantization = config({**FP8, "strategy": "channel"}, PER_TOKEN)
    quantization["config_groups"]["group_0"]["output_activations"] = PER_TOKEN
    with pytest.raises(UnsupportedModelError, match="output activations"):
        checkpoint_scheme(quantization, "config.json")
