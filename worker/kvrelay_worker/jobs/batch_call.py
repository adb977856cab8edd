"""One publisher batch as ``APPEND_BATCH``'s keys and arguments (``JobEvents`` per job):
everything is packed here, so the Lua script only fences and writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvrelay import event_log, log_scripts
from kvrelay.event_frames import pack_events, pack_message, pack_pair
from kvrelay_worker.jobs.store_calls import Message, ScriptCall, StoreCalls

# Entries a worker's tail keeps: more batches than any job's events stay only there
# (``publisher.LOG_MOVE_BATCHES``), with room for retried batches.
TAIL_MAX_LEN = 64


@dataclass
class JobEvents:
    """One job's share of a publisher batch: its events in seq order, already encoded,
    where they are published, and what moves into its log this batch."""

    job_id: str
    # The client's reply channel ('' : none, only watchers hear the job).
    reply_to: str = ""
    # (seq, terminal, event bytes) per event.
    events: list[tuple[int, bool, bytes]] = field(default_factory=list)
    # The events (encoded) to write to the log as one entry this batch (none: they stay
    # in the tail for now): those of earlier batches still only in the tail, then these.
    moved: list[bytes] = field(default_factory=list)
    # The seq of the last event in ``moved``.
    moved_last: int = 0
    # Expiry to set on the log after a move, in seconds (0: leave it as it is).
    expiry_s: int = 0
    # The oldest seq the log keeps (0: keep all; the byte cap, see ``log_window``).
    keep_from: int = 0
    # The job ended here with this batch: its lease is released and its record marked
    # done by the same script call (no ``release_done`` of its own).
    release: bool = False
    # The run that writes (``run_id``; '': the worker's id, as a lease set by hand holds).
    run: str = ""

    @property
    def terminal(self) -> bool:
        return any(terminal for _, terminal, _ in self.events)


def batch_call(store: StoreCalls, jobs: Sequence[JobEvents], tail_expiry_s: int,
               check_each: bool, defer: bool = False) -> tuple[ScriptCall, list[Message]]:
    """``APPEND_BATCH``'s keys and arguments (on its fast path, no per-job key or
    argument at all); and (``defer``) the messages to publish once the batch is written
    and acknowledged, which the script then leaves out (each job with events on its own
    channel too, when jobs are checked: the script's watcher counts stay in Redis)."""
    keys = store.keys
    head, _, tail = keys.events_channel("\0").partition("\0")
    key_list = [store.tail_key, store.fence_key, keys.watching]
    per_job: list[Any] = []
    records: list[bytes] = []
    messages: dict[str, list[bytes]] = {}
    move_keys: list[str] = []
    moves: list[Any] = []
    for job in jobs:
        job_id = job.job_id
        pair = b""
        if job.events:
            events = pack_events([data for _, _, data in job.events])
            pair = pack_pair(job_id, events)
            records.append(event_log.tail_record(job_id, job.events[-1][0], events,
                                                 ended=job.terminal))
            if job.reply_to:
                messages.setdefault(job.reply_to, []).append(pair)
        if check_each:
            key_list += [keys.lease(job_id), keys.watchers(job_id), keys.job_record(job_id)]
            per_job += [job_id, pair, job.run or store.worker_id]
        if job.moved:
            move_keys.append(keys.event_log(job_id))
            moves += [job.moved_last, pack_events(job.moved), 1 if job.terminal else 0,
                      job.keep_from, job.expiry_s, job.run or store.worker_id]
    packed = [(channel, pack_message(pairs)) for channel, pairs in messages.items()]
    deferred: list[Message] = []
    if defer:
        deferred = list(packed)
        if check_each:
            deferred += [(keys.events_channel(job_id), pack_message([pair]))
                         for job_id, pair in zip(per_job[0::3], per_job[1::3], strict=True)
                         if pair]
        packed, head = [], ""
    per_message: list[Any] = [part for channel_message in packed for part in channel_message]
    released = [job for job in jobs if job.release]
    release_keys = [store.running_key] if released else []
    release_args: list[Any] = []
    for job in released:
        release_keys += [keys.job_record(job.job_id), keys.lease(job.job_id)]
        release_args += [job.job_id, job.run or store.worker_id]
    args: list[Any] = [store.worker_id, store.settings.log_max_len, TAIL_MAX_LEN,
                       tail_expiry_s, len(per_job) // 3, len(packed), len(move_keys),
                       head, tail, b"".join(records), len(released), store.ended_ttl_s,
                       *per_job, *per_message, *moves, *release_args]
    return (log_scripts.APPEND_BATCH, key_list + move_keys + release_keys, args), deferred
