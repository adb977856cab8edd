"""Every Redis key, channel and queue name kvrelay uses, in one place: ``Keyspace``.

A ``Keyspace`` is one tenant's set of names. They all share its ``prefix``:
``kvrelay:`` for the default (empty) namespace, ``kvrelay:ns:<namespace>:`` otherwise,
so a Redis ACL user limited to ``~<prefix>*`` and ``&<prefix>*`` sees one tenant's
queues, jobs, logs, control channel and worker registry and nothing else (Celery's own
keys and channels get the same prefix through kombu's ``global_keyprefix``). A
namespace is letters, digits, ``-`` and ``_`` only: no ``:``, so no tenant's prefix is
the start of another's, and no braces, so the ``{job}`` hash tag stays the job id and a
job's log, lease, abort flag and record still share one Redis Cluster slot.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, overload

__all__ = ["NAMESPACE_PATTERN", "Keyspace", "NamespaceError"]

ROOT: Final = "kvrelay:"
# What a namespace may be (also the rule the CLI and the worker settings enforce).
NAMESPACE_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


class NamespaceError(ValueError):
    """A namespace that could not be a safe key prefix."""


class _PerJobKey:
    """A family of per-job names: ``keyspace.<family>(job_id)`` is
    ``<prefix><kind>:{<job_id>}``, the job id in a hash tag so that a job's keys share one
    Redis Cluster slot."""

    def __init__(self, kind: str, doc: str) -> None:
        self.kind = kind
        self.__doc__ = doc

    @overload
    def __get__(self, keyspace: None, owner: type) -> _PerJobKey: ...

    @overload
    def __get__(self, keyspace: Keyspace, owner: type) -> Callable[[str], str]: ...

    def __get__(self, keyspace: Keyspace | None, owner: type) -> _PerJobKey | Callable[[str], str]:
        if keyspace is None:
            return self
        head = f"{keyspace.prefix}{self.kind}:"
        return lambda job_id: f"{head}{{{job_id}}}"


@dataclass(frozen=True, slots=True)
class Keyspace:
    """The names of one namespace (tenant); ``Keyspace()`` is the default one."""

    namespace: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or (
            self.namespace and NAMESPACE_PATTERN.fullmatch(self.namespace) is None
        ):
            raise NamespaceError(
                f"namespace must be 1-64 letters, digits, '-' or '_', got {self.namespace!r}"
            )

    @property
    def prefix(self) -> str:
        """What every key and channel of this namespace starts with."""
        return f"{ROOT}ns:{self.namespace}:" if self.namespace else ROOT

    # ---------------------------------------------------------------- shared names

    @property
    def control_channel(self) -> str:
        """Broadcast channel for control messages (aborts) that every worker listens to."""
        return self.prefix + "control"

    @property
    def workers(self) -> str:
        """Set of worker ids that have announced themselves; each has a heartbeat key."""
        return self.prefix + "workers"

    def reply_channel(self, client_id: str) -> str:
        """Pub/sub channel of one client (SDK instance): the events of every job it started,
        many jobs per message (``kvrelay.event_frames``)."""
        return f"{self.prefix}reply:{client_id}"

    def worker_tail(self, worker_id: str) -> str:
        """Stream of a worker's latest publisher batches: the events of its jobs that are
        not yet in their logs (see ``kvrelay.event_log``)."""
        return f"{self.prefix}tail:{worker_id}"

    def worker_fenced(self, worker_id: str) -> str:
        """Flag set when another worker claimed a job this worker held: from then on its
        batches check every job's lease (before it, none can have been taken)."""
        return f"{self.prefix}fenced:{worker_id}"

    @property
    def watching(self) -> str:
        """Set of the streams watching jobs they did not start (a token each), over every
        job: while it is empty, workers skip reading each job's own watcher count."""
        return self.prefix + "watching"

    def worker_heartbeat(self, worker_id: str) -> str:
        """A worker's heartbeat and stats (JSON), expiring unless refreshed."""
        return f"{self.prefix}worker:{worker_id}"

    # ---------------------------------------------------------------- Celery

    @property
    def celery_key_prefix(self) -> str:
        """kombu's ``global_keyprefix``: empty for the default namespace, whose Celery
        names stay what they always were (so Flower and older producers still see them)."""
        return self.prefix if self.namespace else ""

    def _celery_name(self, key: str) -> str:
        return key[len(self.celery_key_prefix) :]

    def queue(self, model: str) -> str:
        """The Redis list holding ``model``'s queued jobs."""
        return f"{self.prefix}queue:{model}"

    def celery_queue(self, model: str) -> str:
        """The Celery queue's name for ``model``: ``queue(model)`` less kombu's prefix."""
        return self._celery_name(self.queue(model))

    def worker_queue(self, model: str, worker_id: str) -> str:
        """The Redis list of jobs placed on one worker (prefix-aware placement): the worker
        consumes it beside ``queue(model)``; when it dies, live workers move its jobs there."""
        return f"{self.prefix}worker-queue:{model}:{worker_id}"

    def celery_worker_queue(self, model: str, worker_id: str) -> str:
        """The Celery queue's name for ``worker_queue``: less kombu's prefix."""
        return self._celery_name(self.worker_queue(model, worker_id))

    def worker_queues(self, model: str) -> str:
        """Sorted set of the workers of ``model`` that have a queue of their own, scored by
        their latest heartbeat (ms): where live workers look for dead workers' queues."""
        return f"{self.prefix}worker-queues:{model}"

    @property
    def celery_unacked(self) -> str:
        """kombu's hash of delivered-but-unacknowledged messages (its full Redis name)."""
        return f"{self.prefix}celery:unacked"

    @property
    def celery_unacked_index(self) -> str:
        """kombu's sorted set of the same messages, scored by when they were taken (unix s)."""
        return f"{self.prefix}celery:unacked_index"

    @property
    def celery_delivered(self) -> str:
        """Hash of kombu's delivered-but-unacknowledged delivery tags, each naming the worker
        that took the message (written with kombu's own record of it): how live workers
        find the messages a dead worker took (``kvrelay_worker.jobs.dead_deliveries``)."""
        return f"{self.prefix}celery:delivered"

    def celery_transport_options(self) -> dict[str, str]:
        """kombu options putting every Celery key and channel under ``prefix``."""
        options = {
            # Kombu's bookkeeping of delivered-but-unacknowledged messages.
            "unacked_key": self._celery_name(self.celery_unacked),
            "unacked_index_key": self._celery_name(self.celery_unacked_index),
            "unacked_mutex_key": self._celery_name(f"{self.prefix}celery:unacked_mutex"),
        }
        if self.celery_key_prefix:
            options["global_keyprefix"] = self.celery_key_prefix
        return options

    # ---------------------------------------------------------------- per model

    def queue_limit(self, model: str) -> str:
        """Hash of ``model``'s queue limit and retry hint, advertised by its workers.

        The key keeps its older ``admission:`` name: clients and workers of different
        versions must find the same hash."""
        return f"{self.prefix}admission:{model}"

    def running_jobs(self, model: str) -> str:
        """Sorted set of jobs being run for ``model``, scored by lease expiry (ms)."""
        return f"{self.prefix}running:{model}"

    def fresh_jobs(self, model: str) -> str:
        """Sorted set of ``model``'s jobs admitted and not claimed yet, scored by when the
        watch next looks for their message (ms): one lost on its way to a worker is
        pushed again (``kvrelay_worker.jobs.fresh_watch``)."""
        return f"{self.prefix}fresh:{model}"

    # ---------------------------------------------------------------- per tenant

    def tenant_jobs(self, tenant: str) -> str:
        """Sorted set of a tenant's jobs admitted and not ended, scored by the time
        (unix s) past which they count no more (``kvrelay.tenant_quota``)."""
        return f"{self.prefix}tenant:{tenant}:jobs"

    def tenant_queued(self, tenant: str) -> str:
        """Sorted set of a tenant's jobs admitted and not started, scored like
        ``tenant_jobs``."""
        return f"{self.prefix}tenant:{tenant}:queued"

    def tenant_rate(self, tenant: str) -> str:
        """Hash of a tenant's admission token bucket: tokens left and when (unix s)."""
        return f"{self.prefix}tenant:{tenant}:rate"

    # ---------------------------------------------------------------- per job

    events_channel = _PerJobKey("ev", "Pub/sub channel carrying a job's live events to watchers (a client that did not start it).")
    watchers = _PerJobKey("watch", "Count of streams watching a job from other clients: while above 0, its events go to ``events_channel`` too.")
    event_log = _PerJobKey("log", "Stream holding every event of a job, for replay after a gap or a reconnect.")
    abort_flag = _PerJobKey("abort", "Set by a client to cancel a job; checked at pickup and on control messages.")
    end_mark = _PerJobKey("ended", "Set as a job ends; outlives its record so that a late copy of its message is dropped (the job scripts name it after the record: ``end_mark_of``).")
    job_record = _PerJobKey("job", "Hash with the job's payload, state, owner and attempt count (for failover).")
    lease = _PerJobKey("lease", "Short-lived key naming the worker that currently runs the job.")
    requeue_marker = _PerJobKey("requeue", "Short-lived marker: one live worker is requeueing this job after its owner died.")

    # ---------------------------------------------------------------- engine

    def cache_salt(self, salt: str | None) -> str | None:
        """The prefix-cache salt of a request: its own salt, kept apart per namespace."""
        if not self.namespace:
            return salt
        return f"ns:{self.namespace}\x00{salt or ''}"
