"""Every ending fences, whatever the order: a property test against a real Redis.

Many jobs, three workers, and random orders of what their runs and the rest of the
system do to a job through the worker's own job store (so through the Redis functions
themselves): claims, batches (tail only, or moved into the log, or ending the job),
single fenced appends, moves of tail events, releases, lease refreshes, cancels and the
pickups that then end the job unowned, failures of jobs a worker did not run (deadline,
rejected message), leases that run out, takeovers and the too-many-lost-workers ending.
A run whose job was claimed again or ended by another party keeps trying to write, as a
worker that stalled past its lease and wakes up does.

After every step:
- each job's log holds at most one terminal event, and it is the last entry;
- a log that holds its terminal event never changes again;
- nothing a superseded run (its job claimed by another run, or ended by another party)
  does changes its job's log.

On the code before every ending fenced, a pickup that found the job cancelled, the
failure of an unclaimed job and the too-many-lost-workers ending left the old run able
to write (its batches went unchecked, its record still named it), and entries landed
after ``Failed``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrelay import event_log
from kvrelay.event_frames import unpack_events
from kvrelay.event_log import AppendResult
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    TERMINAL_EVENTS,
    ErrorCode,
    Failed,
    Finished,
    Tokens,
    decode_event,
    encode_event,
)
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()
JOBS = 5
WORKERS = 3


@dataclass
class Run:
    """One claim's run, as its worker's publisher would drive it."""

    job: str
    worker: int
    run_id: str
    next_seq: int
    unlogged: list[bytes] = field(default_factory=list)


@dataclass
class World:
    stores: list[JobStore]
    client: redis.Redis
    runs: list[Run] = field(default_factory=list)
    current: dict[str, Run] = field(default_factory=dict)
    superseded: set[str] = field(default_factory=set)
    ended_logs: dict[str, list[Any]] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def supersede(self, job: str) -> None:
        """The job's current run no longer owns it (claimed again, or ended by another)."""
        run = self.current.pop(job, None)
        if run is not None:
            self.superseded.add(run.run_id)


@pytest.fixture
def world(clean_redis_url: str) -> Iterator[World]:
    client = redis.Redis.from_url(clean_redis_url)
    stores = [JobStore(client, WorkerSettings(redis_url=clean_redis_url, model_name="m",
                                              worker_id=f"w{i}", lease_ttl=600,
                                              lease_refresh=1, max_attempts=3))
              for i in range(WORKERS)]
    yield World(stores, client)
    client.close()


def _job(index: int) -> str:
    return f"job{index % JOBS}"


def _tokens(seq: int) -> bytes:
    return encode_event(Tokens(seq=seq, token_ids=[seq], text="x"))


def _log(world: World, job: str) -> list[Any]:
    return list(world.client.xrange(KEYS.event_log(job)) or [])


def _claim(world: World, job: str, worker: int) -> None:
    store = world.stores[worker]
    run_id = f"w{worker}#{next(world.counter)}"
    claim = store.claim(job, "{}", "d", run_id)
    if claim.status == "aborted":  # the pickup of a cancelled job ends it
        store.fail_unclaimed(job, ErrorCode.CANCELLED, "cancelled before it started")
        world.supersede(job)
    elif claim.status == "claimed":
        assert claim.progress is not None
        world.supersede(job)
        run = Run(job, worker, run_id, claim.progress.next_seq)
        world.runs.append(run)
        world.current[job] = run


def _batch(world: World, run: Run, terminal: bool, move: bool) -> None:
    event = (Finished(seq=run.next_seq, finish_reason="length") if terminal
             else Tokens(seq=run.next_seq, token_ids=[run.next_seq], text="x"))
    data = encode_event(event)
    moved = [*run.unlogged, data] if (move or terminal) else []
    batch = JobEvents(run.job, events=[(run.next_seq, terminal, data)], moved=moved,
                      moved_last=run.next_seq, release=terminal, run=run.run_id)
    if world.stores[run.worker].append_batch([batch]) == [1]:
        run.next_seq += 1
        run.unlogged = [] if moved else [*run.unlogged, data]


def _single(world: World, run: Run, terminal: bool) -> None:
    """A fenced append of its own (a claimed job that cannot run fails this way)."""
    event = (Failed(seq=run.next_seq, code=ErrorCode.INVALID_REQUEST, message="no") if terminal
             else Tokens(seq=run.next_seq, token_ids=[1], text="y"))
    result = world.stores[run.worker].append_event(run.job, event, fenced=run.run_id)
    if isinstance(result, int) and result >= 0:
        run.next_seq += 1


def _takeover(world: World, job: str, worker: int) -> None:
    store = world.stores[worker]
    status, _, lost_run = store.check_expired(job)
    if status == "requeue":
        store.commit_requeue(job, lost_run)
    elif status == "exhausted":
        world.supersede(job)
        store.append_unowned(job, Failed(seq=0, code=ErrorCode.WORKER_LOST, message="lost"))


def _step(world: World, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "claim":
        _claim(world, _job(op[1]), op[2] % WORKERS)
    elif kind == "cancel":
        world.client.set(KEYS.abort_flag(_job(op[1])), b"1")
    elif kind == "fail_unclaimed":  # past its deadline at a pickup, or a rejected message
        world.stores[op[2] % WORKERS].fail_unclaimed(_job(op[1]), ErrorCode.DEADLINE_EXCEEDED,
                                                     "too late")
        world.supersede(_job(op[1]))
    elif kind == "expire":  # the lease ran out (its worker stalled or died)
        world.client.delete(KEYS.lease(_job(op[1])))
    elif kind == "takeover":
        _takeover(world, _job(op[1]), op[2] % WORKERS)
    elif world.runs:
        run = world.runs[op[1] % len(world.runs)]
        store = world.stores[run.worker]
        if kind == "batch":
            _batch(world, run, terminal=op[2], move=op[3])
        elif kind == "single":
            _single(world, run, terminal=op[2])
        elif kind == "move" and run.unlogged:
            store.move_to_log(run.job, run.unlogged, run.next_seq - 1, run.run_id)
        elif kind == "release":
            store.release_done(run.job, run.run_id)
        elif kind == "refresh":
            store.refresh_leases([run.job], [run.run_id])


def _check(world: World, op: tuple[Any, ...], before: dict[str, list[Any]],
           superseded_before: set[str]) -> None:
    for index in range(JOBS):
        job = _job(index)
        entries = _log(world, job)
        events = [decode_event(bytes(raw)) for _, fields in entries
                  if (data := event_log.entry_events(fields)) is not None
                  for raw in unpack_events(data)]
        terminals = [i for i, e in enumerate(events) if isinstance(e, TERMINAL_EVENTS)]
        assert len(terminals) <= 1, (job, op, events)
        assert not terminals or terminals[0] == len(events) - 1, (job, op, events)
        if job in world.ended_logs:
            assert entries == world.ended_logs[job], f"{job}'s log changed after its end: {op}"
        elif terminals:
            world.ended_logs[job] = entries
        _check_writers(world, job, entries, op)
    if op[0] in ("batch", "single", "move", "release", "refresh") and world.runs:
        run = world.runs[op[1] % len(world.runs)]
        if run.run_id in superseded_before:
            assert _log(world, run.job) == before[run.job], \
                f"superseded run {run.run_id} wrote to {run.job}'s log: {op}"


def _check_writers(world: World, job: str, entries: list[Any], op: tuple[Any, ...]) -> None:
    """Each entry names a run of its job (or none: an unowned ending), and once a later
    run has an entry in the log no entry of an earlier run follows."""
    claimed = {run.run_id for run in world.runs if run.job == job}
    writers = [w for _, fields in entries if (w := event_log.entry_run(fields))]
    assert set(writers) <= claimed, (job, op, writers, claimed)
    seen: list[str] = []
    for writer in writers:
        if seen and writer == seen[-1]:
            continue
        assert writer not in seen, f"{job}: run {writer} wrote after {seen[-1]}: {op}"
        seen.append(writer)


def test_each_entry_names_the_run_that_wrote_it(world: World) -> None:
    """A takeover's log in words: the first run's events (moved by the second run's claim
    from the first's tail) name the first run, the second's name the second, and an
    ending no run wrote names none."""
    first, second = world.stores[0], world.stores[1]
    assert first.claim("j", "{}", "d", "w0#a").status == "claimed"
    assert first.append_batch([JobEvents("j", events=[(0, False, _tokens(0))], moved=[_tokens(0)],
                                         moved_last=0, run="w0#a")]) == [1]
    assert first.append_batch([JobEvents("j", events=[(1, False, _tokens(1))],
                                         run="w0#a")]) == [1]  # tail only
    world.client.delete(KEYS.lease("j"))  # w0 died
    status, _, lost = second.check_expired("j")
    assert status == "requeue"
    second.commit_requeue("j", lost)
    assert second.claim("j", "{}", "d", "w1#b").status == "claimed"
    assert second.append_batch([JobEvents("j", events=[(2, False, _tokens(2))], moved=[_tokens(2)],
                                          moved_last=2, run="w1#b")]) == [1]
    world.client.set(KEYS.abort_flag("j"), b"1")
    world.client.delete(KEYS.lease("j"))
    assert second.append_unowned("j", Failed(seq=3, code=ErrorCode.CANCELLED, message="")) == 3
    assert [(event_log.seq_of_entry_id(e), event_log.entry_run(f)) for e, f in _log(world, "j")] \
        == [(0, "w0#a"), (1, "w0#a"), (2, "w1#b"), (3, "")]


_index = st.integers(min_value=0, max_value=40)
_ops = st.one_of(
    st.tuples(st.just("claim"), _index, _index),
    st.tuples(st.just("cancel"), _index),
    st.tuples(st.just("fail_unclaimed"), _index, _index),
    st.tuples(st.just("expire"), _index),
    st.tuples(st.just("takeover"), _index, _index),
    st.tuples(st.just("batch"), _index, st.booleans(), st.booleans()),
    st.tuples(st.just("single"), _index, st.booleans()),
    st.tuples(st.just("move"), _index),
    st.tuples(st.just("release"), _index),
    st.tuples(st.just("refresh"), _index),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_ops, min_size=10, max_size=70))
def test_no_entry_after_an_end_and_no_write_from_a_superseded_run(
        world: World, ops: list[tuple[Any, ...]]) -> None:
    world.client.flushdb()
    world.runs.clear()
    world.current.clear()
    world.superseded.clear()
    world.ended_logs.clear()
    for op in ops:
        before = {_job(i): _log(world, _job(i)) for i in range(JOBS)}
        superseded_before = set(world.superseded)
        _step(world, op)
        _check(world, op, before, superseded_before)


def test_a_cancelled_pickup_fences_the_stalled_run(world: World) -> None:
    """The case in words: a run stalls past its lease, the job is cancelled and the
    next pickup ends it; the woken run's batch and its move are refused, and the
    record names no run."""
    owner, other = world.stores[0], world.stores[1]
    assert owner.claim("j", "{}", "d", "w0#a").status == "claimed"
    assert owner.append_batch([JobEvents("j", events=[(0, False, _tokens(0))],
                                         run="w0#a")]) == [1]
    world.client.delete(KEYS.lease("j"))  # w0 stalled past its lease
    world.client.set(KEYS.abort_flag("j"), b"1")  # the caller cancelled
    assert other.claim("j", "{}", "d", "w1#b").status == "aborted"
    assert other.fail_unclaimed("j", ErrorCode.CANCELLED, "cancelled") == 1
    woken = JobEvents("j", events=[(1, False, _tokens(1))], moved=[_tokens(1)], moved_last=1,
                      run="w0#a")
    assert owner.append_batch([woken]) == [AppendResult.FENCED]
    assert not owner.move_to_log("j", [_tokens(1)], 1, "w0#a")
    assert owner.refresh_leases(["j"], ["w0#a"])[0] == ["j"]  # lost: fenced
    assert [type(decode_event(bytes(raw))) for _, fields in _log(world, "j")
            for raw in unpack_events(event_log.entry_events(fields) or b"")] == [Tokens, Failed]
    assert world.client.hget(KEYS.job_record("j"), "run") is None


def test_a_requeue_fences_the_stalled_runs_fast_path(world: World) -> None:
    """A run stalls past its lease (cut off, blackholed), another worker's watch requeues
    its job, and the run wakes before the copy is claimed. Its batches are checked job by
    job from then on: the one that wakes it is refused, and so is the next, which went
    unchecked before (no claim had raised its fence flag, no stream watched) and moved
    events past the refused ones into the log: a gap (chaos seed 10017)."""
    owner, other = world.stores[0], world.stores[1]
    assert owner.claim("j", "{}", "d", "w0#a").status == "claimed"
    assert owner.append_batch([JobEvents("j", events=[(0, False, _tokens(0))], moved=[_tokens(0)],
                                         moved_last=0, run="w0#a")]) == [1]
    world.client.delete(KEYS.lease("j"))  # w0 stalled past its lease
    status, _, lost = other.check_expired("j")
    assert status == "requeue"
    other.commit_requeue("j", lost)
    later = JobEvents("j", events=[(2, True, encode_event(Finished(seq=2, finish_reason="length")))],
                      moved=[encode_event(Finished(seq=2, finish_reason="length"))], moved_last=2,
                      release=True, run="w0#a")
    assert owner.append_batch([later]) == [AppendResult.FENCED]
    assert [event_log.seq_of_entry_id(e) for e, _ in _log(world, "j")] == [0]
    assert world.client.hget(KEYS.job_record("j"), "state") == b"queued"
