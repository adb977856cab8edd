"""The scheduler's side of a step: its row layout, and what ``update_from_output`` did.

The layout is the one definition of which logit rows belong to which sequence; the
update reports, per sampling sequence, the tokens it appended and the drafts it
accepted, with stop strings checked as each token is appended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from kvrelay_worker.engine.kv.kv_cache import KVCacheManager
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.engine.sched.scheduler import Scheduler
from kvrelay_worker.engine.sched.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer


class _StopOn:
    """A detokenizer's stand-in whose stop string completes with ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.seen: list[int] = []

    def add_token(self, token_id: int) -> bool:
        self.seen.append(token_id)
        return token_id == self.token


def _seq(name: str, prompt_len: int, **params: object) -> Sequence:
    return Sequence(request_id=name, choice_index=0, token_ids=list(range(1, prompt_len + 1)),
                    num_prompt_tokens=prompt_len,
                    params=SamplingParams(max_tokens=10, ignore_eos=True, **params))


def _prefilled(*seqs: Sequence) -> Scheduler:
    sched = Scheduler(KVCacheManager(num_blocks=32, block_size=4, enable_caching=False,
                                     model_id="m"), max_num_seqs=8, max_num_batched_tokens=64)
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    sched.update_from_output(out.layout, [50] * out.layout.num_rows)
    return sched


def test_the_layout_gives_each_sampling_sequence_its_rows() -> None:
    drafting, beam, prompt = _seq("a", 5), _seq("b", 3, beam_width=2), _seq("c", 70)
    sched = _prefilled(drafting)
    drafting.draft_token_ids = [7, 8]
    sched.add(beam)
    sched.add(prompt)
    out = sched.schedule()
    layout = out.layout
    # a: its token and 2 drafts (3 rows); b: its whole prompt (its last token's row);
    # c: a chunk that does not reach its end, so no row.
    assert [item.seq for item in out.scheduled] == [drafting, beam, prompt]
    assert [item.seq for item in layout.sampling] == [drafting, beam]
    assert layout.first_rows == [0, 3]
    assert layout.row_seqs == [drafting, drafting, drafting, beam]
    assert layout.row_offsets == [0, 1, 2, 0]
    assert layout.token_indices == [0, 1, 2, 5]
    assert layout.beam_rows == [3]


def test_the_update_reports_tokens_appended_and_drafts_accepted() -> None:
    seq = _seq("a", 5)
    sched = _prefilled(seq)
    seq.draft_token_ids = [7, 8]
    out = sched.schedule()
    update = sched.update_from_output(out.layout, [7, 9, 4])  # draft 8 rejected: 9
    assert update.accepted == [1]
    assert update.appended == [2]
    assert seq.output_token_ids == [50, 7, 9]


def test_a_stop_string_ends_the_sequence_at_the_token_that_completes_it() -> None:
    seq = _seq("a", 5)
    sched = _prefilled(seq)
    detok = _StopOn(7)
    seq.detok = cast("IncrementalDetokenizer", detok)
    seq.draft_token_ids = [6, 7]
    out = sched.schedule()
    update = sched.update_from_output(out.layout, [6, 7, 9])  # both drafts accepted
    assert update.accepted == [2]
    assert update.appended == [2], "nothing after the token that completed the stop string"
    assert detok.seen == [6, 7]
    assert seq.output_token_ids == [50, 6, 7]
    assert seq.status is SequenceStatus.FINISHED_STOPPED
    assert list(seq.block_table) == []


def test_a_detokenizer_error_is_kept_for_the_engine_and_the_update_goes_on() -> None:
    failing, other = _seq("a", 5), _seq("b", 5)
    sched = _prefilled(failing, other)

    class _Broken:
        def add_token(self, token_id: int) -> bool:
            raise UnicodeError("cannot decode")

    failing.detok = cast("IncrementalDetokenizer", _Broken())
    out = sched.schedule()
    update = sched.update_from_output(out.layout, [3, 4])
    assert update.appended == [1, 1]
    assert isinstance(failing.detok_error, UnicodeError)
    assert other.detok_error is None
    assert other.output_token_ids == [50, 4]
