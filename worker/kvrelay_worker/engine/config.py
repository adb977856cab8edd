"""Engine options: one dataclass, validated once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrelay_worker.engine.errors import EngineConfigError

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# KV block sizes (tokens per block) the engine accepts; tests/kernels/test_block_sizes.py
# runs the attention and KV-store kernels at every one of them.
BLOCK_SIZES = (8, 16, 32, 64, 128)


@dataclass
class EngineConfig:
    """Everything that shapes one engine instance.

    ``kv_cache_memory`` (bytes) sizes the KV pool on CPU; on CUDA the pool takes
    ``gpu_memory_utilization`` of the device's memory minus weights and the measured peak
    of a forward pass. ``num_kv_blocks`` overrides both (tests use it to force preemption).
    A preempted sequence is always recomputed (its blocks freed, its prefix usually found
    again in the prefix cache); there is no swap space to choose instead.
    """

    model: str = "smollm2-135m-instruct"
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    kv_cache_memory: int = 1 << 30
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    seed: int = 0
    # CUDA graphs for decode steps (GPU only); False runs every step eagerly.
    enable_cuda_graphs: bool = True
    # Largest batch captured in a CUDA graph (clamped to max_num_seqs).
    cuda_graph_max_batch: int = 256

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        checks: list[tuple[bool, str]] = [
            (self.block_size in BLOCK_SIZES,
             f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}"),
            (self.max_num_seqs >= 1, "max_num_seqs must be at least 1"),
            (self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be at least 1"),
            (self.kv_cache_memory > 0, "kv_cache_memory must be a positive number of bytes"),
            (0.0 < self.gpu_memory_utilization <= 1.0,
             "gpu_memory_utilization must be in (0, 1]"),
            (self.num_kv_blocks is None or self.num_kv_blocks >= 1,
             "num_kv_blocks must be at least 1"),
            (self.max_model_len is None or self.max_model_len >= 1,
             "max_model_len must be at least 1"),
            (self.cuda_graph_max_batch >= 1, "cuda_graph_max_batch must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise EngineConfigError(message)
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise EngineConfigError(
                f"unknown dtype {self.dtype!r}; use auto, float32, float16 or bfloat16"
            )
        try:
            device = self.torch_device
        except RuntimeError as exc:
            raise EngineConfigError(f"invalid device {self.device!r}: {exc}") from exc
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EngineConfigError(f"device {self.device!r} asked for, but CUDA is not available")
        if (device.type == "cuda" and device.index is not None
                and device.index >= torch.cuda.device_count()):
            raise EngineConfigError(
                f"device {self.device!r} asked for, but only {torch.cuda.device_count()} "
                "CUDA device(s) are visible"
            )
        if device.type not in ("cpu", "cuda"):
            raise EngineConfigError(f"device must be cpu or cuda, got {self.device!r}")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]
