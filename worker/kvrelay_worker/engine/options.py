"""The engine's option lists, written once.

``EngineConfig`` checks its fields against these lists and the worker's ``KVRELAY_*``
settings check theirs against the same ones, so a value one accepts the other accepts too.
No torch: the worker validates its settings before it loads any engine code (a test imports
this module in a fresh interpreter and checks that torch stayed out).
"""

from __future__ import annotations

from typing import Final, Literal

# Weight quantization: float weights quantized at load (int8, int4), or a GGUF file's
# quantized blocks kept as stored ("gguf"); "none" keeps float weights; "auto" is "gguf"
# for a GGUF file on CPU and "none" otherwise (engine_model.resolve_quantization).
QUANTIZATIONS: Final = ("none", "int8", "int4", "gguf", "auto")
# Inputs per int4 group (one scale and minimum each).
QUANTIZATION_GROUP_SIZES: Final = (32, 64, 128)

# What a sequence preempted because the KV pool is full does (``engine/sched/preemption.py``).
PreemptionMode = Literal["recompute", "swap", "auto"]
PREEMPTION_MODES: Final[tuple[PreemptionMode, ...]] = ("recompute", "swap", "auto")

# "auto" stores K/V in the model's dtype.
AUTO_KV_CACHE_DTYPE: Final = "auto"
# The quantized KV cache dtypes, each with the name of its torch dtype: one byte per value
# plus a power-of-two scale per token and KV head (``kvrelay_kernels/kv_quant.py``).
QUANTIZED_KV_CACHE_DTYPES: Final = {"int8": "int8", "fp8_e4m3": "float8_e4m3fn"}
KV_CACHE_DTYPE_CHOICES: Final = (AUTO_KV_CACHE_DTYPE, *QUANTIZED_KV_CACHE_DTYPES)

# KV block sizes (tokens per block) the engine accepts; tests/kernels/test_block_sizes.py
# runs the attention and KV-store kernels at every one of them.
BLOCK_SIZES: Final = (8, 16, 32, 64, 128)

# LoRA adapters' largest rank: what PEFT adapters use (8 to 64). Every device slot is
# padded to ``EngineConfig.max_lora_rank`` (default 16), so a wider setting costs every
# adapted row more work even for low-rank adapters.
MAX_LORA_RANK: Final = 64
DEFAULT_MAX_LORA_RANK: Final = 16
