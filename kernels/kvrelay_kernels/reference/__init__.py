"""Plain-PyTorch implementations: the CPU execution path and the test oracle."""

from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.reference.lora import lora_apply_reference
from kvrelay_kernels.reference.norm import fused_add_rms_norm_reference, rms_norm_reference
from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.reference.rotary import rotary_embedding_reference

__all__ = [
    "fused_add_rms_norm_reference",
    "lora_apply_reference",
    "paged_attention_reference",
    "rms_norm_reference",
    "rotary_embedding_reference",
    "store_kv_cache_reference",
]
