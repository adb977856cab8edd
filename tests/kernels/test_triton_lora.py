"""The Triton LoRA shrink/expand kernels against the reference (interpreted on a CPU).

Small shapes keep the interpreter quick while covering what the kernels must get right:
segments longer than one row tile, empty and one-row segments, rows with no adapter,
ranks 8..64 (non-powers of two padded), the shrink split along ``in``, strided rows,
bfloat16 and mixed dtypes. On a GPU the same tests run compiled, plus a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from lora_cases import LoraBatch, make_batch, per_row_oracle

from kvrelay_kernels import lora_apply
from kvrelay_kernels.reference.lora import lora_apply_reference

# float32: IEEE products on both sides, only the order of the sums differs. 16-bit: the
# expand multiplies in TF32, and the interpreter rounds float32 to bfloat16 by truncation
# (a GPU rounds to nearest): up to one unit in the last place of the result.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2**-7, 1e-3),
              torch.float16: (2**-10, 1e-3)}


@pytest.fixture(autouse=True)
def _triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVRELAY_KERNELS", "triton")


def _check(batch: LoraBatch, got: torch.Tensor) -> None:
    want = lora_apply_reference(*batch.args())
    rtol, atol = TOLERANCES[batch.y.dtype]
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("rows", "rank", "dtype"),
    [
        (40, 8, torch.float32),     # the big segment spans two 16-row tiles
        (40, 16, torch.float32),
        (33, 24, torch.float32),    # rank padded to 32 inside the kernel
        (40, 64, torch.float32),
        (40, 16, torch.bfloat16),
        (29, 64, torch.float16),
        (200, 32, torch.bfloat16),  # 32-row tiles
    ],
)
def test_ragged_segments_match_the_reference(device: str, rows: int, rank: int,
                                             dtype: torch.dtype) -> None:
    batch = make_batch(rows, 80, 72, 6, rank, dtype, device, seed=rows + rank)
    y, *rest = batch.args()
    got = lora_apply(y, *rest)
    assert got is y
    _check(batch, got)


@pytest.mark.parametrize("slot", [2, -1])
def test_one_row(device: str, slot: int) -> None:
    batch = make_batch(1, 64, 48, 4, 16, torch.float32, device)
    batch.row_slots.fill_(slot)
    got = lora_apply(*batch.args())
    _check(batch, got)
    assert torch.equal(got, batch.y) == (slot == -1)


def test_against_the_per_row_loop_and_rows_without_adapter_untouched(device: str) -> None:
    batch = make_batch(24, 48, 40, 5, 8, torch.float32, device)
    none = batch.row_slots == -1
    assert none.any()
    batch.x[none] = float("nan")  # never read
    got = lora_apply(*batch.args())
    assert torch.equal(got[none], batch.y[none])
    torch.testing.assert_close(got.double().cpu(), per_row_oracle(batch), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_shrink_split_along_inputs(device: str, num_splits: int) -> None:
    """Partial sums of 2 or 3 splits (the last one short) added by the expand kernel."""
    from kvrelay_kernels.triton_kernels.lora import lora_apply_triton

    batch = make_batch(20, 448, 40, 4, 16, torch.float32, device)
    got = lora_apply_triton(*batch.args(), num_splits=num_splits)
    _check(batch, got)


def test_strided_rows_and_float32_adapters_under_bfloat16(device: str) -> None:
    batch = make_batch(21, 48, 32, 5, 16, torch.bfloat16, device, lora_dtype=torch.float32)
    fused = torch.randn(21, 80, device=device).to(torch.bfloat16)
    wide = torch.randn(21, 64, device=device).to(torch.bfloat16)
    fused[:, 16:48] = batch.y
    wide[:, 8:56] = batch.x
    before = fused.clone()
    lora_apply(fused[:, 16:48], wide[:, 8:56], batch.lora_a, batch.lora_b, batch.row_slots)
    _check(batch, fused[:, 16:48])
    assert torch.equal(fused[:, :16], before[:, :16])
    assert torch.equal(fused[:, 48:], before[:, 48:])


def test_unchecked_out_of_range_slots_leave_their_rows(device: str) -> None:
    batch = make_batch(12, 32, 24, 4, 8, torch.float32, device)
    batch.row_slots[:3] = torch.tensor([4, 99, -7])
    got = lora_apply(*batch.args(), slots_checked=True)
    assert torch.equal(got[:3], batch.y[:3])
    _check(batch, got)


def test_decode_batches_split_the_shrink_to_fill_the_device() -> None:
    """At batch 1 one row tile would leave 131 of 132 SMs idle: the shrink is split, and
    the splits still cover every input."""
    from kvrelay_kernels.triton_kernels.lora import BLOCK_K, plan_lora

    decode = plan_lora(1, 8, 4096, 64, 132)
    assert decode.num_splits > 1
    assert (decode.num_splits - 1) * decode.steps_per_split * BLOCK_K < 4096
    assert decode.num_splits * decode.steps_per_split * BLOCK_K >= 4096
    assert plan_lora(16384, 8, 4096, 64, 132).num_splits == 1, "tiles fill the device"
    assert plan_lora(1, 8, 100, 8, 132).num_splits == 1, "two input steps: nothing to split"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_with_new_slots() -> None:
    """Capture fails on any device-to-host sync: the launch reads no slot back, and a
    replay after new slots are copied in follows them."""
    first = make_batch(64, 256, 192, 6, 16, torch.bfloat16, "cuda", seed=1)
    second = make_batch(64, 256, 192, 6, 16, torch.bfloat16, "cuda", seed=2)
    y, x, a, b, slots = (t.clone() for t in first.args())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        lora_apply(y.clone(), x, a, b, slots)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lora_apply(y, x, a, b, slots)
    for batch in (second, first):
        y.copy_(batch.y)
        x.copy_(batch.x)
        slots.copy_(batch.row_slots)
        graph.replay()
        torch.cuda.synchronize()
        _check(LoraBatch(batch.y, batch.x, a, b, batch.row_slots), y)
