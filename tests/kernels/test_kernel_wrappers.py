"""The public wrappers: argument checks before launch, and the choice of implementation."""

from __future__ import annotations

import pytest
import torch
from attention_cases import make_batch

import kvrelay_kernels
from kvrelay_kernels import KernelArgumentError
from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels import kv_store, norm, paged_attention, rotary


def _attention_args(**overrides: torch.Tensor) -> dict[str, torch.Tensor]:
    clean, _ = make_batch([1, 3], [5, 20], num_heads=4, num_kv_heads=2, head_size=64,
                          block_size=16, dtype=torch.float32, device="cpu")
    args = dict(zip(("query", "key_cache", "value_cache", "block_tables", "query_start_loc",
                     "seq_lens"), clean.args(), strict=True))
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"query": torch.zeros(4, 4)}, "query must have 3 dimensions"),
        ({"query": torch.zeros(4, 3, 64)}, "multiple of KV heads"),
        ({"query": torch.zeros(4, 4, 64, dtype=torch.int32)}, "query must be one of"),
        ({"value_cache": torch.zeros(3, 16, 2, 64)}, "value_cache must have shape"),
        ({"key_cache": torch.zeros(8, 16, 2, 128)[..., :64]}, "must have shape"),
        ({"block_tables": torch.zeros(3, 2, dtype=torch.int32)}, "block_tables must have"),
        ({"seq_lens": torch.zeros(2)}, "seq_lens must be one of"),
        ({"query_start_loc": torch.zeros(2, dtype=torch.int32)}, "query_start_loc must"),
        ({"seq_lens": torch.zeros(2, dtype=torch.int32, device="meta")}, "one device"),
    ],
)
def test_paged_attention_rejects_bad_arguments(overrides, message):
    with pytest.raises(KernelArgumentError, match=message):
        kvrelay_kernels.paged_attention(**_attention_args(**overrides), scale=0.125)


def test_paged_attention_rejects_non_contiguous_cache():
    args = _attention_args()
    args["key_cache"] = args["key_cache"].transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(KernelArgumentError, match="key_cache must be contiguous"):
        kvrelay_kernels.paged_attention(**args, scale=0.125)


def test_store_kv_cache_rejects_bad_arguments():
    key = torch.zeros(3, 2, 64)
    cache = torch.zeros(4, 16, 2, 64)
    slots = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(KernelArgumentError, match="slot_mapping must have shape"):
        kvrelay_kernels.store_kv_cache(key, key, cache, cache, slots[:2])
    with pytest.raises(KernelArgumentError, match="cast before storing"):
        kvrelay_kernels.store_kv_cache(key.half(), key.half(), cache, cache, slots)
    with pytest.raises(KernelArgumentError, match="slot_mapping must be one of"):
        kvrelay_kernels.store_kv_cache(key, key, cache, cache, slots.float())


def test_norm_and_rotary_reject_bad_arguments():
    x = torch.zeros(2, 64)
    with pytest.raises(KernelArgumentError, match="weight must have shape"):
        kvrelay_kernels.rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(KernelArgumentError, match="residual must have shape"):
        kvrelay_kernels.fused_add_rms_norm(x, torch.zeros(2, 32), torch.ones(64), 1e-6)
    with pytest.raises(KernelArgumentError, match="contiguous in its last dimension"):
        kvrelay_kernels.rms_norm(torch.zeros(64, 2).t(), torch.ones(64), 1e-6)
    positions = torch.zeros(2, dtype=torch.int64)
    table = torch.zeros(10, 64)
    with pytest.raises(KernelArgumentError, match="whole number of heads"):
        kvrelay_kernels.rotary_embedding(positions, torch.zeros(2, 100), torch.zeros(2, 64),
                                         table, 64)
    with pytest.raises(KernelArgumentError, match="at most head_size"):
        kvrelay_kernels.rotary_embedding(positions, x, x, torch.zeros(10, 128), 64)


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the Triton path must not run for CPU tensors")


def test_cpu_tensors_take_the_reference_path(monkeypatch):
    monkeypatch.delenv("KVRELAY_KERNELS", raising=False)
    monkeypatch.setattr(paged_attention, "paged_attention_triton", _refuse)
    monkeypatch.setattr(kv_store, "store_kv_cache_triton", _refuse)
    monkeypatch.setattr(norm, "rms_norm_triton", _refuse)
    monkeypatch.setattr(norm, "fused_add_rms_norm_triton", _refuse)
    monkeypatch.setattr(rotary, "rotary_embedding_triton", _refuse)
    assert kvrelay_kernels.select_backend(torch.device("cpu")) == "reference"
    out = kvrelay_kernels.paged_attention(**_attention_args(), scale=0.125)
    assert out.shape == (4, 4, 64)
    assert not out.isnan().any()
    key = torch.randn(2, 2, 64)
    cache = torch.zeros(2, 16, 2, 64)
    kvrelay_kernels.store_kv_cache(key, key, cache, cache.clone(), torch.tensor([0, 5]))
    x = torch.randn(2, 64)
    kvrelay_kernels.rms_norm(x, torch.ones(64), 1e-6)
    kvrelay_kernels.fused_add_rms_norm(x, x, torch.ones(64), 1e-6)
    kvrelay_kernels.rotary_embedding(torch.tensor([0, 3]), x.clone(), x.clone(),
                                     torch.zeros(10, 64), 64)


def test_forced_triton_path_matches_reference(monkeypatch, device):
    # KVRELAY_KERNELS=triton sends even CPU tensors through the wrappers to Triton (the
    # interpreter here); on a GPU the same call is the default path.
    args = {name: t.to(device) for name, t in _attention_args().items()}
    expected = paged_attention_reference(*args.values(), 0.125)
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")
    got = kvrelay_kernels.paged_attention(**args, scale=0.125)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    with pytest.raises(KernelArgumentError, match="head size 32 is not supported"):
        kvrelay_kernels.paged_attention(**_attention_args(query=torch.zeros(4, 4, 32),
                                                          key_cache=torch.zeros(3, 16, 2, 32),
                                                          value_cache=torch.zeros(3, 16, 2, 32)),
                                        scale=0.125)


def test_forced_triton_path_passes_window_and_softcap(monkeypatch, device):
    args = {name: t.to(device) for name, t in _attention_args().items()}
    options = {"sliding_window": 3, "softcap": 2.0}
    expected = paged_attention_reference(*args.values(), 0.125, **options)
    assert not torch.allclose(expected, paged_attention_reference(*args.values(), 0.125))
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")
    got = kvrelay_kernels.paged_attention(**args, scale=0.125, **options)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
