"""kvrelay's compute kernels: Triton on CUDA, plain PyTorch everywhere else.

Every public function checks its arguments, then runs the Triton kernel when the tensors
live on a CUDA device and the reference implementation otherwise. The references are also
the oracles the Triton kernels are tested against.
"""

from kvrelay_kernels.attention import paged_attention
from kvrelay_kernels.backend import select_backend
from kvrelay_kernels.checks import KernelArgumentError
from kvrelay_kernels.kv_store import store_kv_cache
from kvrelay_kernels.lora import lora_apply
from kvrelay_kernels.norm import fused_add_rms_norm, rms_norm
from kvrelay_kernels.rotary import rotary_embedding

__all__ = [
    "KernelArgumentError",
    "fused_add_rms_norm",
    "lora_apply",
    "paged_attention",
    "rms_norm",
    "rotary_embedding",
    "select_backend",
    "store_kv_cache",
]
