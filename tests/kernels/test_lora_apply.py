"""``lora_apply`` on the CPU (the reference path) against a per-row float64 loop.

Ragged batches: a slot with no row, one with one row, one with half the batch, rows in
random order and rows with no adapter; ranks 8..64, smaller ranks zero-padded inside a
larger R, float32 and bfloat16, one row and a few hundred. Then the argument checks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from lora_cases import LoraBatch, make_batch, per_row_oracle

from kvrelay_kernels import KernelArgumentError, lora_apply
from kvrelay_kernels.lora import MAX_LORA_RANK
from kvrelay_kernels.reference.lora import lora_apply_reference
from kvrelay_kernels.reference.lora_segments import LoraSegments

# float32: accumulation order only. bfloat16: one rounding of the float32 sum, at most
# half a unit in the last of bfloat16's 8 significant bits (2**-8 of the value).
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2**-8, 1e-5)}


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVRELAY_KERNELS", raising=False)


def _check(batch: LoraBatch, got: torch.Tensor) -> None:
    rtol, atol = TOLERANCES[batch.y.dtype]
    torch.testing.assert_close(got.double(), per_row_oracle(batch), rtol=rtol, atol=atol)


@pytest.mark.parametrize("rows", [1, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16, 32, 64])
def test_matches_the_per_row_loop(rank: int, dtype: torch.dtype, rows: int) -> None:
    batch = make_batch(rows, 96, 80, 6, rank, dtype, seed=rank + rows)
    y, *rest = batch.args()
    got = lora_apply(y, *rest)
    assert got is y, "the LoRA term is added to y in place"
    assert got.dtype == dtype
    _check(batch, got)


def test_smaller_ranks_padded_inside_r_equal_the_unpadded_adapters() -> None:
    """Adapters of rank 8, 16, 64 and 32 stacked at R = 64 with zero rows of A and zero
    columns of B give what each adapter gives alone."""
    ranks = [8, 16, 64, 32]
    rows, in_f, out_f, r_max = 40, 48, 56, 64
    gen = torch.Generator().manual_seed(1)
    a_list = [torch.randn(r, in_f, generator=gen) / in_f**0.5 for r in ranks]
    b_list = [torch.randn(out_f, r, generator=gen) / r**0.5 for r in ranks]
    a = torch.zeros(len(ranks), r_max, in_f)
    b = torch.zeros(len(ranks), out_f, r_max)
    for s, r in enumerate(ranks):
        a[s, :r] = a_list[s]
        b[s, :, :r] = b_list[s]
    x = torch.randn(rows, in_f, generator=gen)
    y = torch.randn(rows, out_f, generator=gen)
    slots = torch.randint(-1, len(ranks), (rows,), generator=gen)
    expected = y.double().clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[t] += (x[t].double() @ a_list[s].double().T) @ b_list[s].double().T
    got = lora_apply(y.clone(), x, a, b, slots)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_rows_without_an_adapter_are_left_bit_for_bit() -> None:
    """A row of slot -1 is not read: even inf/NaN activations leave its output as it was."""
    batch = make_batch(30, 64, 40, 5, 16, torch.float32)
    slots = batch.row_slots
    none = slots == -1
    assert none.any()
    assert (~none).any()
    batch.x[none] = float("nan")
    y = batch.y.clone()
    lora_apply(y, batch.x, batch.lora_a, batch.lora_b, slots)
    assert torch.equal(y[none], batch.y[none])
    assert torch.isfinite(y).all()
    _check(batch, y)


@pytest.mark.parametrize("slot", [-1, 3])
def test_every_row_on_one_slot(slot: int) -> None:
    batch = make_batch(12, 32, 24, 4, 8, torch.bfloat16)
    batch.row_slots.fill_(slot)
    got = lora_apply(*batch.args())
    _check(batch, got)
    assert torch.equal(got, batch.y) == (slot == -1)


def test_strided_rows_and_adapters_in_another_dtype() -> None:
    """``y`` a column block of a fused output, ``x`` a column block of a wider input, both
    bfloat16 with float32 adapters: only the block is written."""
    batch = make_batch(25, 48, 32, 5, 16, torch.bfloat16, lora_dtype=torch.float32)
    fused = torch.randn(25, 96).to(torch.bfloat16)
    wide = torch.randn(25, 64).to(torch.bfloat16)
    fused[:, 40:72] = batch.y
    wide[:, 8:56] = batch.x
    before = fused.clone()
    lora_apply(fused[:, 40:72], wide[:, 8:56], batch.lora_a, batch.lora_b, batch.row_slots)
    _check(batch, fused[:, 40:72])
    assert torch.equal(fused[:, :40], before[:, :40])
    assert torch.equal(fused[:, 72:], before[:, 72:])


def test_int32_and_int64_slots_agree_and_the_door_takes_the_reference() -> None:
    batch = make_batch(50, 32, 24, 6, 8, torch.float32)
    got64 = lora_apply(*batch.args())
    y, x, a, b, slots = batch.args()
    got32 = lora_apply(y, x, a, b, slots.to(torch.int32))
    assert torch.equal(got64, got32)
    assert torch.equal(got64, lora_apply_reference(*batch.args()))


def test_no_rows() -> None:
    batch = make_batch(4, 16, 8, 4, 8, torch.float32)
    y = batch.y[:0]
    assert lora_apply(y, batch.x[:0], batch.lora_a, batch.lora_b, batch.row_slots[:0]) is y


def test_unchecked_out_of_range_slots_leave_their_rows() -> None:
    """With ``slots_checked`` the caller vouches for the slots; a bad one is then skipped,
    not read past the stack."""
    batch = make_batch(10, 16, 8, 4, 8, torch.float32)
    batch.row_slots[:3] = torch.tensor([4, 99, -7])
    got = lora_apply(*batch.args(), slots_checked=True)
    assert torch.equal(got[:3], batch.y[:3])
    batch.row_slots[:3] = -1
    _check(batch, got)


def _bad_cases() -> list[tuple[str, Callable[[LoraBatch], tuple[torch.Tensor, ...]], str]]:
    def swap(i: int, value: torch.Tensor) -> Callable[[LoraBatch], tuple[torch.Tensor, ...]]:
        return lambda b: tuple(value if j == i else t for j, t in enumerate(b.args()))

    def with_slot(value: int) -> Callable[[LoraBatch], tuple[torch.Tensor, ...]]:
        def make(b: LoraBatch) -> tuple[torch.Tensor, ...]:
            slots = b.row_slots.clone()
            slots[1] = value
            return b.y, b.x, b.lora_a, b.lora_b, slots
        return make

    return [
        ("x-1d", swap(1, torch.randn(16)), "x must have 2 dimensions"),
        ("y-rows", swap(0, torch.randn(5, 8)), r"y must have shape .*, got \(5, 8\)"),
        ("a-in", swap(2, torch.randn(4, 8, 15)), r"lora_a must have shape .*16\), got \(4, 8, 15\)"),
        ("b-out", swap(3, torch.randn(4, 9, 8)), r"lora_b must have shape \(4, 8, 8\)"),
        ("b-rank", swap(3, torch.randn(4, 8, 16)), r"lora_b must have shape \(4, 8, 8\)"),
        ("b-slots", swap(3, torch.randn(3, 8, 8)), r"lora_b must have shape \(4, 8, 8\)"),
        ("slots-len", swap(4, torch.zeros(5, dtype=torch.long)), "row_slots must have shape"),
        ("slots-float", swap(4, torch.zeros(6)), "row_slots must be one of int32, int64"),
        ("x-int", swap(1, torch.zeros(6, 16, dtype=torch.int32)), "x must be one of float16"),
        ("a-float64", swap(2, torch.randn(4, 8, 16, dtype=torch.float64)), "lora_a must be"),
        ("a-strided", swap(2, torch.randn(4, 16, 8).transpose(1, 2)),
         "lora_a must be contiguous"),
        ("x-columns", swap(1, torch.randn(16, 6).T), "x must be contiguous in its last"),
        ("device", swap(3, torch.randn(4, 8, 8, device="meta")), "must be on one device"),
        ("rank", lambda b: (b.y, b.x, torch.randn(4, MAX_LORA_RANK + 1, 16),
                            torch.randn(4, 8, MAX_LORA_RANK + 1), b.row_slots),
         f"over the supported {MAX_LORA_RANK}"),
        ("slot-past-end", with_slot(4), r"a slot in \[0, 4\), got 4"),
        ("slot-below-none", with_slot(-2), "got -2"),
    ]


@pytest.mark.parametrize(("make", "message"), [c[1:] for c in _bad_cases()],
                         ids=[c[0] for c in _bad_cases()])
def test_bad_arguments_raise(make: Callable[[LoraBatch], tuple[torch.Tensor, ...]],
                             message: str) -> None:
    batch = make_batch(6, 16, 8, 4, 8, torch.float32)
    args = make(batch)
    with pytest.raises(KernelArgumentError, match=message):
        lora_apply(*args)


# ------------------------------------------------------------- step-shared segments

def _segments_apply(batch: LoraBatch, y: torch.Tensor | None = None) -> torch.Tensor:
    y = batch.y.clone() if y is None else y
    return lora_apply(y, batch.x, batch.lora_a, batch.lora_b, batch.row_slots,
                      slots_checked=True, segments=LoraSegments(batch.row_slots.cpu()))


@pytest.mark.parametrize("rows", [1, 40, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segments_match_the_per_row_loop(rows: int, dtype: torch.dtype) -> None:
    """Ragged slots (one adapter holds half the rows) take the per-segment loop."""
    batch = make_batch(rows, 96, 80, 6, 16, dtype, seed=rows)
    _check(batch, _segments_apply(batch))


@pytest.mark.parametrize("order", ["sorted", "round-robin", "uneven", "with-none"])
def test_segments_batched_over_equal_segments(order: str) -> None:
    """Segments of (nearly) one length take the padded ``bmm`` path: padding positions
    add nothing, and a row without an adapter is not read even when it is NaN."""
    batch = make_batch(32, 64, 48, 6, 16, torch.float32, seed=7)
    slots = {"sorted": torch.arange(32) // 8, "round-robin": torch.arange(32) % 4,
             "uneven": torch.tensor([s % 4 for s in range(31)] + [1]),
             "with-none": torch.tensor([-1 if s % 9 == 0 else s % 3 for s in range(32)])}
    batch.row_slots = slots[order]
    plan = LoraSegments(batch.row_slots).plan(6, torch.device("cpu"))
    assert plan.width > 0, "equal segments take the batched path"
    assert (plan.rows is None) == (order == "sorted")
    none = batch.row_slots == -1
    batch.x[none] = float("nan")
    got = _segments_apply(batch)
    assert torch.equal(got[none], batch.y[none])
    _check(batch, got)


def test_segments_write_a_column_block_and_skip_bad_slots() -> None:
    batch = make_batch(25, 48, 32, 5, 16, torch.bfloat16, lora_dtype=torch.float32)
    batch.row_slots[:2] = torch.tensor([5, 99])
    fused = torch.randn(25, 96).to(torch.bfloat16)
    fused[:, 40:72] = batch.y
    before = fused.clone()
    _segments_apply(batch, fused[:, 40:72])
    assert torch.equal(fused[:2], before[:2])
    batch.row_slots[:2] = -1
    _check(batch, fused[:, 40:72])
    assert torch.equal(fused[:, :40], before[:, :40])
    assert torch.equal(fused[:, 72:], before[:, 72:])


def test_segments_of_another_batch_size_are_refused() -> None:
    batch = make_batch(6, 16, 8, 4, 8, torch.float32)
    with pytest.raises(KernelArgumentError, match="segments describe 5 rows"):
        lora_apply(*batch.args(), segments=LoraSegments(batch.row_slots[:5]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segments_mix_prompt_runs_and_decode_rows(dtype: torch.dtype) -> None:
    """A prefill chunk's long runs of one slot are added in place (float32), the decode
    rows around them gathered; a long run without an adapter is left alone."""
    runs = [(2, 20), (-1, 17), (0, 3), (1, 1), (3, 1), (0, 1), (1, 40), (3, 16), (2, 2)]
    slots = torch.cat([torch.full((n,), s) for s, n in runs])
    batch = make_batch(slots.numel(), 64, 48, 6, 16, dtype, seed=3)
    batch.row_slots = slots
    plan = LoraSegments(slots).plan(6, torch.device("cpu"))
    assert [(s, b - a) for s, a, b in plan.runs] == [(2, 20), (1, 40), (3, 16)]
    assert sorted(s for s, _, _ in plan.segments) == [0, 1, 2, 3]
    none = slots == -1
    batch.x[none] = float("nan")
    got = _segments_apply(batch)
    assert torch.equal(got[none], batch.y[none])
    _check(batch, got)
