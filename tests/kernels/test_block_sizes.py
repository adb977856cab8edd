"""Every KV block size the engine accepts, through the attention and KV-store kernels.

Small shapes, so the interpreter runs them in seconds; on a GPU the same tests compile.
Contexts cover a partial first block, exactly one block, several blocks and (at 8) many
tiles; the poisoned batch turns any read past a sequence's blocks into NaN. Also the
launch plan against devices' shared-memory budgets: a tile never grows with the block
size, and a device with too little room gets fewer stages, smaller tiles, or a clear error.
"""

from __future__ import annotations

import pytest
import torch
from attention_cases import TOLERANCES, make_batch

from kvrelay_kernels import KernelArgumentError
from kvrelay_kernels.reference.kv_store import store_kv_cache_reference
from kvrelay_kernels.reference.paged_attention import paged_attention_reference
from kvrelay_kernels.triton_kernels import launch_config
from kvrelay_kernels.triton_kernels.kv_store import store_kv_cache_triton
from kvrelay_kernels.triton_kernels.paged_attention import paged_attention_triton
from kvrelay_worker.engine.options import BLOCK_SIZES

H200_OPTIN = 232448  # shared_memory_per_block_optin of an H100/H200
ADA_OPTIN = 101376  # of an RTX 4090 / L4 / L40S (sm_89)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize(("query_lens", "seq_lens"), [
    ([1, 1, 1, 1], [1, 5, 8, 200]),
    ([1, 12, 30, 1], [140, 12 + 9, 30, 1]),
], ids=["decode", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_at_every_block_size(block_size, query_lens, seq_lens, dtype, device):
    clean, poisoned = make_batch(query_lens, seq_lens, num_heads=4, num_kv_heads=2,
                                 head_size=64, block_size=block_size, dtype=dtype,
                                 device=device)
    expected = paged_attention_reference(*clean.args(), 0.125)
    got = paged_attention_triton(*poisoned.args(), 0.125)
    assert not got.isnan().any(), "the kernel read a slot or block it must not read"
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_kv_store_at_every_block_size(block_size, device):
    num_blocks, num_tokens, heads, head = 3, 2 * block_size, 2, 64
    key = torch.randn(num_tokens, heads, head, device=device)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[0] = -1
    key_cache = torch.randn(num_blocks, block_size, heads, head, device=device)
    value_cache = torch.randn_like(key_cache)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    store_kv_cache_reference(key, value, expected_k, expected_v, slots)
    store_kv_cache_triton(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """A CUDA device whose opt-in shared memory per block the test chooses."""
    budget = {"bytes": H200_OPTIN}
    monkeypatch.setattr(launch_config, "_shared_memory_optin", lambda index: budget["bytes"])
    monkeypatch.setattr(launch_config, "_sm_count", lambda index: 132)
    return budget


def _plans(dtype: torch.dtype, head_size: int, block_size: int):
    cuda = torch.device("cuda", 0)
    decode = launch_config.decode_config(num_seqs=1, num_heads=32, num_kv_heads=8,
                                         head_size=head_size, block_size=block_size,
                                         max_seq_len=4096, dtype=dtype, device=cuda)
    prefill = launch_config.prefill_config(num_heads=32, num_kv_heads=8, head_size=head_size,
                                           block_size=block_size, dtype=dtype, device=cuda)
    return decode, prefill


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiles_do_not_grow_with_the_block_size(fake_gpu, dtype):
    plans = {b: _plans(dtype, 128, b) for b in BLOCK_SIZES}
    assert len({(d.tile_n, d.num_stages, p.tile_n, p.num_stages)
                for d, p in plans.values()}) == 1


def test_an_h200_keeps_the_tuned_defaults(fake_gpu):
    decode, prefill = _plans(torch.bfloat16, 128, 16)
    assert (decode.tile_n, decode.num_stages) == (launch_config.DECODE_TILE_N,
                                                  launch_config.DECODE_NUM_STAGES)
    assert (prefill.tile_n, prefill.num_stages) == (launch_config.DECODE_TILE_N, 2)
    decode, prefill = _plans(torch.float32, 128, 128)
    assert (decode.tile_n, decode.num_stages) == (launch_config.DECODE_TILE_N // 2, 2)


def test_a_smaller_budget_gets_fewer_stages_then_smaller_tiles(fake_gpu):
    fake_gpu["bytes"] = ADA_OPTIN
    decode, _ = _plans(torch.bfloat16, 128, 16)
    assert decode.num_stages < launch_config.DECODE_NUM_STAGES
    fake_gpu["bytes"] = 24 * 1024
    decode, prefill = _plans(torch.bfloat16, 128, 128)
    for tile_n, stages, rows in ((decode.tile_n, decode.num_stages, decode.group_pad),
                                 (prefill.tile_n, prefill.num_stages, prefill.block_m)):
        assert launch_config.shared_memory_estimate(tile_n, stages, 128, torch.bfloat16,
                                                    rows) <= 24 * 1024


def test_a_device_too_small_for_the_shapes_is_refused_clearly(fake_gpu):
    fake_gpu["bytes"] = 16 * 1024
    with pytest.raises(KernelArgumentError, match="shared memory per program"):
        launch_config.check_attention_fits(num_heads=32, num_kv_heads=8, head_size=128,
                                           block_size=16, dtype=torch.float32,
                                           device=torch.device("cuda", 0))
