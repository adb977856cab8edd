"""The CPU C++ kernels of a decoder layer's small steps against the PyTorch references:
RMSNorm (plain and fused with the residual add), rotary embedding, the KV-cache store.

The public entry points take the C++ kernels for float32 CPU tensors; each test runs the
entry point (or the op itself) and the reference on copies of the same inputs.
"""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels import fused_add_rms_norm, rms_norm, rotary_embedding, store_kv_cache
from kvrelay_kernels.cpu_kernels.build import load_cpu_kernels
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.reference.norm import fused_add_rms_norm_reference, rms_norm_reference
from kvrelay_kernels.reference.rotary import rotary_embedding_reference

pytestmark = pytest.mark.skipif(not load_cpu_kernels(), reason="no C++ compiler here")


@pytest.mark.parametrize("shape", [(1, 576), (7, 64), (3, 5, 96), (40, 128)])
def test_rms_norm_matches_the_reference(shape: tuple[int, ...]) -> None:
    x, weight = torch.randn(shape), torch.randn(shape[-1])
    got = torch.ops.kvrelay_cpu.rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(got, rms_norm_reference(x, weight, 1e-5), rtol=1e-5, atol=1e-6)
    assert torch.equal(rms_norm(x, weight, 1e-5), got)


@pytest.mark.parametrize("rows", [1, 9, 40])
def test_fused_add_rms_norm_matches_the_reference(rows: int) -> None:
    x, residual, weight = torch.randn(rows, 192), torch.randn(rows, 192), torch.randn(192)
    out, summed = fused_add_rms_norm(x, residual, weight, 1e-6)
    expected_out, expected_sum = fused_add_rms_norm_reference(x, residual, weight, 1e-6)
    assert torch.equal(summed, expected_sum)
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)
    kernel_out, _ = torch.ops.kvrelay_cpu.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(out, kernel_out)


def test_norm_of_other_dtypes_keeps_the_reference() -> None:
    x, weight = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    assert torch.equal(rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5))


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [64, 32])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_rotary_matches_the_reference_on_strided_qkv_slices(
        is_neox: bool, rot_dim: int, index_dtype: torch.dtype) -> None:
    """Query and key as the attention layer has them: slices of one fused QKV row."""
    tokens, head, q_heads, kv_heads = 6, 64, 9, 3
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head)
    table = torch.randn(4096, rot_dim)
    positions = torch.tensor([0, 5, 17, 4095, 3, 3], dtype=index_dtype)
    expected, original = qkv.clone(), qkv.clone()
    q, k, _ = qkv.split([q_heads * head, kv_heads * head, kv_heads * head], dim=-1)
    eq, ek, _ = expected.split([q_heads * head, kv_heads * head, kv_heads * head], dim=-1)
    rotary_embedding(positions, q, k, table, head, is_neox=is_neox)
    rotary_embedding_reference(positions, (eq, ek), table, head, is_neox)
    torch.testing.assert_close(qkv, expected, rtol=1e-6, atol=1e-6)
    assert not torch.equal(qkv, original)  # query and key did rotate
    assert torch.equal(qkv[:, (q_heads + kv_heads) * head:],  # the values did not
                       original[:, (q_heads + kv_heads) * head:])


def test_rotary_refuses_a_position_beyond_the_table() -> None:
    q, k = torch.randn(2, 64), torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="outside the table"):
        torch.ops.kvrelay_cpu.rotary_embedding(torch.tensor([1, 16]), q, k,
                                               torch.randn(16, 64), 64, True)


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_kv_store_matches_the_reference_and_skips_padding(slot_dtype: torch.dtype) -> None:
    tokens, heads, head = 5, 3, 64
    kv = torch.randn(tokens, 2 * heads * head)  # key and value as strided slices
    key = kv[:, : heads * head].view(tokens, heads, head)
    value = kv[:, heads * head:].view(tokens, heads, head)
    caches = [torch.zeros(4, 16, heads, head) for _ in range(4)]
    slots = torch.tensor([3, -1, 16, 63, 0], dtype=slot_dtype)
    store_kv_cache(key, value, caches[0], caches[1], slots)
    store_kv_cache_reference(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2])
    assert torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, heads, head)[63], key[3])
    assert caches[0].view(-1, heads, head)[[1, 2, 4]].abs().sum() == 0  # only named slots


def test_kv_store_refuses_a_slot_beyond_the_cache() -> None:
    key = torch.randn(1, 2, 8)
    caches = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        torch.ops.kvrelay_cpu.store_kv_cache(key, key, *caches, torch.tensor([8]))
