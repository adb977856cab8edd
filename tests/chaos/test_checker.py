"""The checker on hand-made histories: a correct one passes, and each way a stream or a
store can go wrong is named (so a harness run that reports nothing means something)."""

from __future__ import annotations

import base64
import json

import fakeredis

from chaos.checker import Violation, check_jobs
from chaos.retention import retained, retained_past_last_write
from chaos.schedule import CANCEL, ORPHAN, RESUME, STREAM, JobPlan
from chaos.tap import Tapped, WireTap
from chaos.workload import Chunk, JobRun
from kvrelay.protocol import (
    AnyEvent,
    Failed,
    Finished,
    Started,
    Timings,
    Tokens,
    encode_event,
)

REFERENCE = [[11, 12, 13, 14, 15, 16]]
NOW = 1000.0


def _history(tokens: list[int]) -> list[AnyEvent]:
    events: list[AnyEvent] = [Started(seq=0, worker="w:1")]
    events += [Tokens(seq=i + 1, token_ids=[t], text="") for i, t in enumerate(tokens)]
    events.append(Finished(seq=len(events), finish_reason="length",
                           timings=Timings(queue=0.5)))
    return events


def _run(events: list[AnyEvent], behaviour: str = STREAM) -> JobRun:
    run = JobRun(JobPlan(0, 0.0, "p", max_tokens=6, behaviour=behaviour), job_id="j")
    run.enqueued_at, run.queue_deadline = NOW, NOW + 2.0
    run.chunks = [Chunk(e.seq, e.index, tuple(e.token_ids), NOW + e.seq)
                  for e in events if isinstance(e, Tokens)]
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.token_ids]
    run.completion, run.finish_reasons = [tokens], ["length"]
    run.outcome = "completed"
    return run


def _tap(events: list[AnyEvent], at: float = NOW) -> list[Tapped]:
    return [Tapped(at + i * 0.01, e, encode_event(e)) for i, e in enumerate(events)]


def _check(run: JobRun, log: list[AnyEvent], tapped: list[Tapped] | None = None,
           writers: list[str] | None = None) -> list[Violation]:
    return check_jobs([run], {0: REFERENCE}, {"j": log},
                      {"j": tapped if tapped is not None else _tap(log)}, [],
                      {"j": writers} if writers is not None else None)


def _rules(found: list[Violation]) -> set[str]:
    return {v.rule for v in found}


def test_a_correct_history_passes() -> None:
    log = _history(REFERENCE[0])
    assert _check(_run(log), log) == []


def test_a_token_repeated_at_a_takeover_seam_is_caught() -> None:
    # The successor resumed one token early: 7 tokens for 6, the third one twice.
    log = _history([11, 12, 13, 13, 14, 15])
    assert {"log-tokens", "tokens", "streamed-tokens"} <= _rules(_check(_run(log), log))


def test_a_gap_in_the_log_is_caught() -> None:
    log = _history(REFERENCE[0])
    del log[3]
    assert "log-seq" in _rules(_check(_run(_history(REFERENCE[0])), log))


def test_a_completion_missing_from_the_log_is_caught() -> None:
    log = _history(REFERENCE[0])
    assert {"log-terminal"} <= _rules(_check(_run(log), log[:-1], _tap(log)))


def test_an_event_published_after_the_end_is_caught() -> None:
    log = _history(REFERENCE[0])
    late = Tokens(seq=len(log), token_ids=[99], text="")
    assert "after-terminal" in _rules(_check(_run(log), log, _tap([*log, late])))


def test_two_events_under_one_seq_are_caught() -> None:
    log = _history(REFERENCE[0])
    stale = Tokens(seq=2, token_ids=[77], text="")
    assert "wire-conflict" in _rules(_check(_run(log), log, _tap([*log, stale])))


def test_a_run_that_starts_after_its_cancel_is_caught() -> None:
    log: list[AnyEvent] = [Started(seq=0, worker="w:1"),
                           Tokens(seq=1, token_ids=[11], text=""),
                           Started(seq=2, worker="w:2", attempt=2),
                           Failed(seq=3, code="cancelled", message="")]
    run = _run(log[:2], behaviour=CANCEL)
    run.outcome, run.cancel_acked_at, run.ended_at = "Cancelled", NOW + 1, NOW + 2
    tapped = [*_tap(log[:2]), Tapped(NOW + 30, log[2], encode_event(log[2])),
              Tapped(NOW + 30, log[3], encode_event(log[3]))]
    assert "run-after-cancel" in _rules(_check(run, log, tapped))
    # The same history with the new run before the cancel is lawful.
    early = [*_tap(log[:3]), Tapped(NOW + 1.5, log[3], encode_event(log[3]))]
    assert _check(run, log, early) == []


def _taken_over() -> tuple[list[AnyEvent], list[str]]:
    """Run a wrote seqs 0-3, run b took over at seq 4: the log and each event's writer."""
    log: list[AnyEvent] = [Started(seq=0, worker="w:1", run="w:1#a")]
    log += [Tokens(seq=i + 1, token_ids=[t], text="") for i, t in enumerate(REFERENCE[0][:3])]
    log.append(Started(seq=4, worker="w:2", attempt=2, run="w:2#b"))
    log += [Tokens(seq=i + 5, token_ids=[t], text="") for i, t in enumerate(REFERENCE[0][3:])]
    log.append(Finished(seq=8, finish_reason="length"))
    return log, ["w:1#a"] * 4 + ["w:2#b"] * 5


def test_two_runs_writing_after_a_fence_are_caught() -> None:
    log, writers = _taken_over()
    assert _check(_run(log), log, writers=writers) == []
    # Run a, fenced at b's claim, kept writing: its entry lands between b's.
    stale = [*writers]
    stale[6] = "w:1#a"
    assert "run-fence" in _rules(_check(_run(log), log, writers=stale))
    # Run a's entry holds seq 4, which b published as its Started.
    stale = [*writers]
    stale[4:6] = ["w:1#a", "w:1#a"]
    assert "run-fence" in _rules(_check(_run(log), log, writers=stale))
    # Runs out of their attempts' order.
    swapped = [*log]
    swapped[0] = Started(seq=0, worker="w:1", attempt=3, run="w:1#a")
    assert "run-fence" in _rules(_check(_run(swapped), swapped, writers=writers))


def test_a_run_that_starts_after_the_end_is_caught() -> None:
    log = _history(REFERENCE[0])
    again = Started(seq=3, worker="w:2", attempt=2, run="w:2#c")
    found = _check(_run(log), log, [*_tap(log), Tapped(NOW + 5, again, encode_event(again))])
    assert "run-after-end" in _rules(found)
    # The ending run's batch published again (its reply was lost): no new run.
    tapped = _tap(log)
    assert _check(_run(log), log, [*tapped, Tapped(NOW + 5, log[0], tapped[0].raw)]) == []


def test_a_pickup_after_the_queue_deadline_is_caught() -> None:
    log = _history(REFERENCE[0])
    log[-1] = Finished(seq=log[-1].seq, finish_reason="length", timings=Timings(queue=5.0))
    assert "queue-deadline" in _rules(_check(_run(log), log))


def test_a_taken_over_job_is_judged_by_its_first_pickup() -> None:
    # After a takeover the worker's queue time measures the last claim: not a late pickup.
    log = _history(REFERENCE[0])
    log.insert(3, Started(seq=3, worker="w:2", attempt=2))  # seqs renumbered below
    log = [type(e)(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "seq": i})
           for i, e in enumerate(log)]
    log[-1] = Finished(seq=log[-1].seq, finish_reason="length", timings=Timings(queue=5.0))
    assert _check(_run(log), log) == []
    late = _tap(log, at=NOW + 10)
    assert "queue-deadline" in _rules(_check(_run(log), log, late))


def test_a_chunk_missing_from_the_log_is_caught() -> None:
    log = _history(REFERENCE[0])
    run = _run(log)
    del log[2]  # the caller saw seq 2; the log lost it (seqs renumbered: no gap)
    log = [type(e)(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "seq": i})
           for i, e in enumerate(log)]
    assert "client-vs-log" in _rules(_check(run, log, _tap(log)))


def _timed_out(log: list[AnyEvent]) -> JobRun:
    run = JobRun(JobPlan(0, 0.0, "p", max_tokens=6, queue_timeout=2.0), job_id="j")
    run.enqueued_at, run.queue_deadline = NOW, NOW + 2.0
    run.outcome, run.error, run.ended_at = "QueueTimeout", "no pickup", NOW + 7.0
    return run


def test_a_queue_timeout_is_lawful_only_for_a_job_never_started_in_time() -> None:
    dropped: list[AnyEvent] = [Failed(seq=0, code="queue_timeout", message="")]
    assert _check(_timed_out(dropped), dropped) == []
    aborted: list[AnyEvent] = [Failed(seq=0, code="cancelled", message="")]
    assert _check(_timed_out(aborted), aborted, _tap(aborted, at=NOW + 9)) == []


def test_a_lost_enqueue_behind_a_queue_timeout_is_caught() -> None:
    # Nothing ever ran and nothing ended the job: the enqueue or the delivery was lost.
    assert "queue-timeout" in _rules(_check(_timed_out([]), [], []))


def test_a_queue_timeout_after_a_timely_start_is_caught() -> None:
    log: list[AnyEvent] = [Started(seq=0, worker="w:1"), Tokens(seq=1, token_ids=[11], text="")]
    assert "queue-timeout" in _rules(_check(_timed_out(log), log, _tap(log, at=NOW + 1)))
    ended = [*log, Failed(seq=2, code="cancelled", message="")]
    assert "queue-timeout" in _rules(_check(_timed_out(ended), ended, _tap(ended, at=NOW + 1)))


def test_a_lost_cancel_is_caught_even_when_the_job_finishes_whole() -> None:
    log = _history(REFERENCE[0])
    run = _run(log, behaviour=CANCEL)
    run.cancel_acked_at, run.ended_at = NOW + 1, NOW + 1.5
    assert _check(run, log, _tap(log, at=NOW)) == []  # finishing as the cancel came
    tapped = [*_tap(log[:-1]), Tapped(NOW + 20, log[-1], encode_event(log[-1]))]
    assert "cancel-finished" in _rules(_check(run, log, tapped))


def test_a_job_whose_caller_died_must_still_end_whole() -> None:
    log = _history(REFERENCE[0])
    run = JobRun(JobPlan(0, 0.0, "p", max_tokens=6, behaviour=ORPHAN), job_id="j")
    run.enqueued_at, run.queue_deadline = NOW, NOW + 2.0
    run.chunks = [Chunk(e.seq, e.index, tuple(e.token_ids), NOW + e.seq)
                  for e in log[:3] if isinstance(e, Tokens)]
    run.outcome = "killed"
    assert _check(run, log) == []
    # Nobody ended it (a job whose caller died was dropped or left hanging).
    assert "orphan" in _rules(_check(run, log[:-1]))
    cut = [*log[:4], Failed(seq=4, code="cancelled", message="")]
    assert "orphan" in _rules(_check(run, cut))


def test_a_skewed_worker_clock_widens_only_the_queue_bounds() -> None:
    # The worker's queue time reads 1.5 s past the 2 s limit: a clock 2 s ahead explains it.
    log = _history(REFERENCE[0])
    log[-1] = Finished(seq=log[-1].seq, finish_reason="length", timings=Timings(queue=3.5))
    assert "queue-deadline" in _rules(_check(_run(log), log))
    assert check_jobs([_run(log)], {0: REFERENCE}, {"j": log}, {"j": _tap(log)}, [],
                      skew_s=2.0) == []


def test_a_job_a_worker_took_in_time_may_start_past_its_deadline() -> None:
    # Its message was lost on its way and pushed again: the record says picked in time.
    log = _history(REFERENCE[0])
    log[-1] = Finished(seq=log[-1].seq, finish_reason="length", timings=Timings(queue=7.9))
    assert "queue-deadline" in _rules(_check(_run(log), log))
    assert check_jobs([_run(log)], {0: REFERENCE}, {"j": log}, {"j": _tap(log)}, [],
                      picked={"j"}) == []


def test_a_resume_answered_unknown_job_is_lawful_only_once_the_log_could_expire() -> None:
    log = _history(REFERENCE[0])
    tapped = _tap(log)
    ended = tapped[-1].at
    for resumed_after, lawful in ((4.5, True), (1.0, False)):
        run = _run(log, behaviour=RESUME)
        run.outcome, run.error, run.ended_at = "UnknownJob", "no such job", ended + resumed_after
        found = check_jobs([run], {0: REFERENCE}, {"j": log}, {"j": tapped}, [],
                           log_ttl_s=4.0)
        assert ("incomplete" not in _rules(found)) is lawful, found


def test_an_undecodable_tapped_message_is_counted() -> None:
    tap = WireTap("redis://unused")
    assert tap._record(NOW, b"\xff not a message") == []
    assert len(tap.undecodable) == 1


def test_retention_reads_base64_message_bodies() -> None:
    store = fakeredis.FakeRedis()
    body = base64.b64encode(json.dumps([[{"prompt": "secret prompt"}], {}, {}]).encode())
    message = {"body": body.decode(), "content-encoding": "utf-8",
               "properties": {"body_encoding": "base64", "delivery_tag": "t1"}, "headers": {}}
    store.rpush("kvrelay:celery:some-queue", json.dumps(message))
    found = retained(store, ["job-1"], ["secret prompt"])
    assert any("some-queue holds a prompt" in line for line in found), found
    store.flushall()
    tagged = dict(message, body=base64.b64encode(b'{"job_id": "job-1"}').decode())
    store.hset("unacked", "t1", json.dumps([tagged, "", "q"]))
    found = retained(store, ["job-1"], ["secret prompt"])
    assert any("unacked holds the id of an ended job" in line for line in found), found


def test_retention_looks_again_at_a_key_written_late() -> None:
    store = fakeredis.FakeRedis()
    store.set("kvrelay:log:{job-1}", "x", ex=3)  # written again 1 s before the look
    store.set("kvrelay:record:{job-2}", "x")  # never expires
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        store.delete("kvrelay:log:{job-1}")  # expired meanwhile, as its TTL said

    found = retained_past_last_write(store, ["job-1", "job-2"], [], 4.0, sleep)
    assert slept == [4.0]
    assert found == ["kvrelay:record:{job-2} (ttl -1)"]
    store.set("kvrelay:log:{job-1}", "x", ex=3)
    found = retained_past_last_write(store, ["job-1"], [], 4.0, lambda _: None)
    assert found == ["kvrelay:log:{job-1} (ttl 3)"]  # written again and again: it counts
