"""Faults a test injects into a real worker process from its start (this folder goes first
on the process's ``PYTHONPATH``, so Python imports this module before anything else).

- ``TEST_FAULT_CLOCK_SKEW_S``: the process's wall clock (``time.time``) runs this many
  seconds ahead (negative: behind), as on a host whose clock is off; monotonic clocks
  are left alone, as they are by a skewed host clock.
- ``TEST_FAULT_KILL_THREAD`` and ``TEST_FAULT_KILL_WHEN``: once the file named by the
  second exists, the thread named by the first gets an exception raised inside it (at its
  next Python instruction, wherever it is in its loop), as an error nothing catches would.

- ``TEST_FAULT_PAUSE_CLAIM_OF``: a job whose id starts with this is never claimed: the
  task thread that took its message waits (for the test to kill the worker) just before
  the claim, so the message is delivered and unacknowledged, and its job never started.
- ``TEST_FAULT_LOSE_COPIES``: the first this many job copies the worker sends (failover
  requeues, hand-backs) vanish, as pushes to a primary that is then demoted would.

- ``TEST_FAULT_BROKEN`` and ``TEST_FAULT_VICTIM``: a deliberately broken worker (the
  chaos checker's broken variants, ``tests/chaos/schedule.py``), wrong only for the job
  whose prompt contains the second: ``duplicate_token`` (one token of its stream sent
  twice, as a takeover that resumed a token early would), ``after_terminal`` (an event
  published after its terminal one), ``ignore_cancel`` (its cancel is dropped: it runs
  to its end), ``leak_message`` (a copy of its Celery message, body base64-encoded as
  kombu stores it, left in a Redis list after its end), ``skip_terminal`` (its terminal
  event is never sent: the job hangs, holding its lease), ``write_after_fence`` (its run
  stops keeping its lease after 20 events, so the job is taken over, and once its
  successor has written it writes one more entry straight into the log, under its own
  run id: a fenced run that kept appending).

Nothing here is a stand-in for the code under test: the worker runs as in production,
with its clock or one of its threads broken, or a message lost on its way.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class InjectedThreadFault(RuntimeError):
    """Raised inside a worker thread by ``TEST_FAULT_KILL_THREAD``."""


def _skew_clock(skew_s: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew_s
    time.time_ns = lambda: real_time_ns() + int(skew_s * 1e9)


def _kill_thread_when(name: str, trigger: str) -> None:
    def watch() -> None:
        while not os.path.exists(trigger):
            time.sleep(0.02)
        while True:
            target = next((t for t in threading.enumerate() if t.name == name), None)
            if target is not None and target.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(target.ident), ctypes.py_object(InjectedThreadFault))
                return
            time.sleep(0.02)

    threading.Thread(target=watch, name="test-fault-injector", daemon=True).start()


if os.environ.get("TEST_FAULT_CLOCK_SKEW_S"):
    _skew_clock(float(os.environ["TEST_FAULT_CLOCK_SKEW_S"]))
if os.environ.get("TEST_FAULT_KILL_THREAD") and os.environ.get("TEST_FAULT_KILL_WHEN"):
    _kill_thread_when(os.environ["TEST_FAULT_KILL_THREAD"], os.environ["TEST_FAULT_KILL_WHEN"])


def _patch_when_imported(module: str, name: str, patch: Callable[[Any], None]) -> None:
    """Apply ``patch`` to ``module`` once the process has imported it as far as ``name``."""
    def watch() -> None:
        while not hasattr(sys.modules.get(module), name):
            time.sleep(0.005)
        patch(sys.modules[module])

    threading.Thread(target=watch, name="test-fault-patcher", daemon=True).start()


def _pause_claims_of(prefix: str) -> None:
    def patch(job_store: Any) -> None:
        claim = job_store.JobStore.claim

        def paused_claim(self: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
            if job_id.startswith(prefix):
                time.sleep(600)  # the test kills the worker meanwhile
            return claim(self, job_id, *args, **kwargs)

        job_store.JobStore.claim = paused_claim

    _patch_when_imported("kvrelay_worker.jobs.job_store", "JobStore", patch)


def _lose_copies(count: int) -> None:
    lost = [0]
    lock = threading.Lock()

    def patch(app: Any) -> None:
        send = app.send_job_copy

        def lossy_send(*args: Any, **kwargs: Any) -> None:
            with lock:
                if lost[0] < count:
                    lost[0] += 1
                    print(f"test fault: lost job copy {lost[0]} of {count}", flush=True)
                    return
            send(*args, **kwargs)

        app.send_job_copy = lossy_send

    _patch_when_imported("kvrelay_worker.app", "send_job_copy", patch)


if os.environ.get("TEST_FAULT_PAUSE_CLAIM_OF"):
    _pause_claims_of(os.environ["TEST_FAULT_PAUSE_CLAIM_OF"])
if os.environ.get("TEST_FAULT_LOSE_COPIES"):
    _lose_copies(int(os.environ["TEST_FAULT_LOSE_COPIES"]))


def _victim(job: Any, marker: str) -> bool:
    return marker in (getattr(job.request, "prompt", None) or "")


def _break_publisher(variant: str, marker: str) -> None:
    """Break the worker where every event leaves it (``jobs.publisher``)."""
    state = {"tokens": 0, "done": False}

    def patch(publisher: Any) -> None:
        from kvrelay.protocol import TERMINAL_EVENTS, Tokens

        cls = publisher.Publisher
        put, after_write = cls.put, cls._after_write

        def broken_put(self: Any, items: list[Any]) -> None:
            kept = []
            for item in items:
                event = getattr(item, "event", None)
                if event is None or not _victim(item.job, marker):
                    kept.append(item)
                    continue
                if variant == "duplicate_token" and isinstance(event, Tokens) and \
                        event.token_ids and not state["done"]:
                    state["tokens"] += len(event.token_ids)
                    if state["tokens"] >= 8:
                        state["done"] = True
                        event.token_ids = [*event.token_ids, event.token_ids[-1]]
                        print(f"test fault: duplicated a token of {item.job.job_id}",
                              flush=True)
                if variant == "skip_terminal" and isinstance(event, TERMINAL_EVENTS):
                    print(f"test fault: dropped the terminal event of {item.job.job_id}",
                          flush=True)
                    continue
                kept.append(item)
            put(self, kept)

        def broken_after_write(self: Any, item: Any, result: object, now: float) -> None:
            after_write(self, item, result, now)
            if item.outcome is None or isinstance(result, Exception) or \
                    not _victim(item.job, marker):
                return
            if variant == "after_terminal":
                late = Tokens(seq=item.event.seq + 1, token_ids=[7], text="x")
                self.store.redis.publish(item.job.request.reply_to, _message(
                    item.job.job_id, late))
                print(f"test fault: published seq {late.seq} after the end of "
                      f"{item.job.job_id}", flush=True)
            elif variant == "leak_message":
                import base64
                import json

                body = base64.b64encode(item.job.payload_json.encode()).decode()
                self.store.redis.rpush("kvrelay:chaos-leftover", json.dumps({
                    "body": body, "content-encoding": "utf-8",
                    "content-type": "application/json", "headers": {},
                    "properties": {"body_encoding": "base64", "delivery_tag": "leak"}}))
                print(f"test fault: left a copy of {item.job.job_id}'s message", flush=True)

        cls.put = broken_put
        cls._after_write = broken_after_write

    _patch_when_imported("kvrelay_worker.jobs.publisher", "Publisher", patch)


def _message(job_id: str, event: Any) -> bytes:
    from kvrelay.event_frames import pack_events, pack_message, pack_pair
    from kvrelay.protocol import encode_event

    return pack_message([pack_pair(job_id, pack_events([encode_event(event)]))])


def _ignore_cancels(marker: str) -> None:
    def patch(owned: Any) -> None:
        abort = owned.OwnedJobs.abort

        def deaf_abort(self: Any, job_id: str) -> None:
            job = self._jobs.get(job_id)
            if job is not None and _victim(job, marker):
                print(f"test fault: ignored the cancel of {job_id}", flush=True)
                return
            abort(self, job_id)

        owned.OwnedJobs.abort = deaf_abort

    _patch_when_imported("kvrelay_worker.jobs.owned_jobs", "OwnedJobs", patch)


# How many events the ``write_after_fence`` victim's first run writes before its lease
# is let go.
_STALE_AFTER_EVENTS = 20


def _write_after_fence(marker: str) -> None:
    """The victim's first run lets its lease go (its job is taken over) and, fenced,
    appends one entry after its successor's, naming itself as the writer."""
    let_go: set[str] = set()

    def patch(keeper: Any) -> None:
        moving = keeper.LeaseKeeper.moving

        def forgetful(self: Any, held: list[Any], now: float) -> list[Any]:
            kept = []
            for job in moving(self, held, now):
                if _victim(job, marker) and job.attempt == 1 and \
                        job.next_seq >= _STALE_AFTER_EVENTS:
                    if job.run_id not in let_go:
                        let_go.add(job.run_id)
                        print(f"test fault: run {job.run_id} lets its lease go", flush=True)
                        threading.Thread(target=_append_as, args=(
                            self.store.redis, self.store.keys.event_log(job.job_id),
                            job.run_id),
                            name="test-fault-stale-run", daemon=True).start()
                    continue
                kept.append(job)
            return kept

        keeper.LeaseKeeper.moving = forgetful

    _patch_when_imported("kvrelay_worker.jobs.lease_keeper", "LeaseKeeper", patch)


def _append_as(client: Any, log_key: str, run: str) -> None:
    """Once another run has an entry in the job's log (and the log has not ended), add
    one entry after it under ``run``: what a fenced run that kept writing would leave."""
    from kvrelay import event_log
    from kvrelay.event_frames import pack_events
    from kvrelay.protocol import Tokens, encode_event

    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        last = client.xrevrange(log_key, count=1)
        if last:
            entry, fields = last[0]
            writer = event_log.entry_run(fields)
            if event_log.TERMINAL_FIELD.encode() in fields:
                break
            if writer and writer != run:
                seq = event_log.seq_of_entry_id(entry) + 1
                event = Tokens(seq=seq, token_ids=[7], text="x")
                event_log.add_entry(client, log_key, seq, pack_events([encode_event(event)]),
                                    run=run)
                print(f"test fault: fenced run {run} wrote seq {seq} of {log_key} after "
                      f"{writer}", flush=True)
                return
        time.sleep(0.02)
    print(f"test fault: found no successor's entry in {log_key} to write after",
          flush=True)


_BROKEN = os.environ.get("TEST_FAULT_BROKEN", "")
_VICTIM = os.environ.get("TEST_FAULT_VICTIM", "")
if _BROKEN and _VICTIM:
    if _BROKEN == "ignore_cancel":
        _ignore_cancels(_VICTIM)
    elif _BROKEN == "write_after_fence":
        _write_after_fence(_VICTIM)
    else:
        _break_publisher(_BROKEN, _VICTIM)
