"""Engine options: one dataclass, validated once at start-up."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.options import (
    BLOCK_SIZES,
    DEFAULT_MAX_LORA_RANK,
    MAX_LORA_RANK,
    PREEMPTION_MODES,
    QUANTIZATION_GROUP_SIZES,
    QUANTIZATIONS,
    QUANTIZED_KV_CACHE_DTYPES,
)
from kvrelay_worker.engine.runner.device import indexed_device
from kvrelay_worker.engine.runner.device_capability import check_kv_cache_dtype
from kvrelay_worker.engine.spec.speculative_config import (
    DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_SPECULATIVE,
    SpeculativeMethod,
    SpeculativeSettingError,
    check_ngram_range,
    check_num_speculative_tokens,
    parse_speculative,
)

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

# kv_cache_dtype choices besides "auto" -> their torch dtypes (``engine/options.py``).
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, torch_name) for name, torch_name in QUANTIZED_KV_CACHE_DTYPES.items()
}


@dataclass
class EngineConfig:
    """Everything that shapes one engine instance.

    ``kv_cache_memory`` (bytes) sizes the KV pool on CPU; on CUDA the pool takes
    ``gpu_memory_utilization`` of the device's memory minus weights and the measured peak
    of a forward pass. ``num_kv_blocks`` overrides both (tests use it to force preemption).

    ``preemption_mode`` says what happens to a sequence preempted because the pool is
    full: ``"recompute"`` frees its blocks and prefills it again later (what the prefix
    cache still holds is not recomputed); ``"swap"`` copies its blocks to a host pool and
    back, keeping its computed tokens; ``"auto"`` (the default) picks per sequence by an
    estimate of recompute time against copy time (``engine/sched/preemption.py``). Swapping
    falls back to recompute whenever the host pool is full. ``swap_space_gib`` sizes that
    host pool, on the GPU (pinned memory) as on the CPU (a second set of CPU tensors);
    ``num_swap_blocks`` overrides it, in blocks. The recompute mode allocates no host pool.

    ``kv_cache_dtype``: ``"auto"`` keeps K/V in ``dtype``; ``"int8"`` and ``"fp8_e4m3"``
    store each (token, KV head) row as one-byte values plus a one-byte power-of-two scale
    (``kvrelay_kernels/kv_quant.py``), so the same memory holds about 4x the blocks of a
    float32 cache (2x of bfloat16), at a small quality cost (``benchmarks/kv_quant.py``).
    Both run on CPU (the reference attention) and CUDA (the Triton kernels).

    ``target_step_ms`` is an inter-token latency target: when set, each step's prompt
    chunks are sized by a cost model fitted to the measured step times so that the step
    (and so every decoding stream's next token) is predicted to take at most that long;
    a step's first prompt chunk still gets at least ``min_prefill_chunk`` tokens, so long
    prompts keep progressing, and ``max_num_batched_tokens`` stays the upper bound. None
    (the default) keeps the fixed budget: every step takes as many prompt tokens as
    ``max_num_batched_tokens`` allows (``engine/sched/prefill_pacing.py``).

    ``speculative`` turns on speculative decoding: ``"ngram"`` matches a request's last n
    tokens (n from ``speculative_ngram_min`` to ``speculative_ngram_max``) against its own
    prompt and output and proposes what followed; ``"draft:<model>"`` lets a smaller model
    with the same vocabulary propose. At most ``num_speculative_tokens`` are proposed per
    sequence per step and the target verifies them in one pass; requests whose
    ``SamplingParams.speculative`` is False decode without it. ``"off"`` (the default):
    never (``engine/spec/speculative_config.py`` holds the forms and limits).
    ``speculative_adaptive`` (default True) lets each step verify only the drafts that its
    measured step costs and each request's acceptance say will pay; False verifies every
    proposal (tests and measurements).
    """

    model: str = "smollm2-135m-instruct"
    device: str = "auto"
    dtype: str = "auto"
    # "auto" (the model's dtype), "int8" or "fp8_e4m3"; see the class docstring.
    kv_cache_dtype: str = "auto"
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
    # "recompute", "swap" or "auto"; see the class docstring.
    preemption_mode: str = "auto"
    # Host memory for swapped-out KV blocks, in GiB (2**30 bytes); 0 means none.
    swap_space_gib: float = 1.0
    num_swap_blocks: int | None = None
    # Inter-token latency target in milliseconds; None: the fixed token budget.
    target_step_ms: float | None = None
    # The fewest prompt tokens a step with a prompt to compute gives it under the target
    # (at most max_num_batched_tokens).
    min_prefill_chunk: int = 32
    # "off", "ngram" or "draft:<model name or path>"; see the class docstring.
    speculative: str = DEFAULT_SPECULATIVE
    # k: the most draft tokens per sequence per step, 1 to 16.
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    # The n-gram lengths prompt lookup tries: 1 <= min <= max <= 8.
    speculative_ngram_min: int = DEFAULT_NGRAM_MIN
    speculative_ngram_max: int = DEFAULT_NGRAM_MAX
    # True: each step verifies only the drafts its measured cost and acceptance pay for
    # (engine/spec/policy.py); False: every proposed draft, every step.
    speculative_adaptive: bool = True
    # Weight-only quantization (``QUANTIZATIONS``): "int8" (per output channel), "int4"
    # (groups of ``quantization_group_size`` with scale and minimum), "gguf" (a GGUF
    # source's Q8_0/Q4_0/Q4_1 blocks kept as stored); "none" (or None): float weights;
    # "auto": "gguf" for a GGUF source on CPU, else "none" (decided at load).
    quantization: str | None = "none"
    quantization_group_size: int = 32
    # LoRA adapters (``engine/lora``): how many can serve in one step (device slots; 0
    # turns LoRA off and costs nothing), and the largest rank they may have (the slots'
    # padded width: a wider one costs every adapted row more work).
    max_loras: int = 0
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

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
            (self.preemption_mode in PREEMPTION_MODES,
             f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, "
             f"got {self.preemption_mode!r}"),
            (math.isfinite(self.swap_space_gib) and self.swap_space_gib >= 0,
             f"swap_space_gib must be a finite number of GiB, at least 0, "
             f"got {self.swap_space_gib}"),
            (self.num_swap_blocks is None or self.num_swap_blocks >= 0,
             "num_swap_blocks must be at least 0"),
            (self.preemption_mode != "swap" or self.has_swap_space,
             "preemption_mode='swap' needs host memory: set swap_space_gib (or "
             "num_swap_blocks) above 0"),
            (self.target_step_ms is None
             or (math.isfinite(self.target_step_ms) and self.target_step_ms > 0),
             f"target_step_ms must be a positive, finite number of milliseconds (or None "
             f"for the fixed token budget), got {self.target_step_ms}"),
            (self.target_step_ms is None or self.enable_chunked_prefill,
             "target_step_ms sizes prompt chunks: it needs enable_chunked_prefill=True"),
            ((self.quantization or "none") in QUANTIZATIONS,
             f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
             f"got {self.quantization!r}"),
            (self.quantization_group_size in QUANTIZATION_GROUP_SIZES,
             f"quantization_group_size must be one of "
             f"{', '.join(map(str, QUANTIZATION_GROUP_SIZES))}, "
             f"got {self.quantization_group_size}"),
            (self.min_prefill_chunk >= 1,
             f"min_prefill_chunk must be at least 1, got {self.min_prefill_chunk}"),
            (self.max_loras >= 0, f"max_loras must be at least 0, got {self.max_loras}"),
            (1 <= self.max_lora_rank <= MAX_LORA_RANK,
             f"max_lora_rank must be 1 to {MAX_LORA_RANK}, got {self.max_lora_rank}"),
        ]
        for ok, message in checks:
            if not ok:
                raise EngineConfigError(message)
        try:
            parse_speculative(self.speculative)
            check_num_speculative_tokens(self.num_speculative_tokens)
            check_ngram_range(self.speculative_ngram_min, self.speculative_ngram_max)
        except SpeculativeSettingError as exc:
            raise EngineConfigError(str(exc)) from None
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise EngineConfigError(
                f"unknown dtype {self.dtype!r}; use auto, float32, float16 or bfloat16"
            )
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineConfigError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; use auto, "
                f"{', '.join(KV_CACHE_DTYPES)}"
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
        check_kv_cache_dtype(self.kv_cache_dtype, device)

    @property
    def speculative_method(self) -> SpeculativeMethod:
        """"off", "ngram" or "draft" (the part of ``speculative`` before any colon)."""
        return parse_speculative(self.speculative).method

    @property
    def speculative_draft_model(self) -> str | None:
        """The draft model's name or path for ``"draft:<model>"``; None otherwise."""
        return parse_speculative(self.speculative).draft_model

    @property
    def has_swap_space(self) -> bool:
        if self.num_swap_blocks is not None:
            return self.num_swap_blocks > 0
        return self.swap_space_gib > 0

    @property
    def torch_device(self) -> torch.device:
        """The engine's device; a CUDA one always carries its index (``engine/runner/device.py``)."""
        if self.device == "auto":
            return indexed_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        return indexed_device(torch.device(self.device))

    @property
    def weight_quantization(self) -> str:
        """``quantization`` with None spelled "none"."""
        return self.quantization or "none"

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return _DTYPES[self.dtype]

    @property
    def torch_kv_cache_dtype(self) -> torch.dtype:
        """The KV cache tensors' dtype: the model's, or a quantized one (int8, float8)."""
        if self.kv_cache_dtype == "auto":
            return self.torch_dtype
        return KV_CACHE_DTYPES[self.kv_cache_dtype]
