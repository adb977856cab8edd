"""Every Redis key, channel and queue name kvrelay uses, in one place.

All names share the ``kvrelay:`` prefix. A job's own keys put the job id in a hash tag
(``{job}``) so that, on a Redis Cluster, a job's log, lease, abort flag and record live in
one slot and a script can touch them together.
"""

from __future__ import annotations

PREFIX = "kvrelay:"

# Broadcast channel for control messages (aborts) that every worker listens to.
CONTROL_CHANNEL = f"{PREFIX}control"
# Set of worker ids that have announced themselves; each has a heartbeat key.
WORKERS = f"{PREFIX}workers"


# Kombu's bookkeeping of delivered-but-unacknowledged messages (Celery transport options).
CELERY_UNACKED = f"{PREFIX}celery:unacked"
CELERY_UNACKED_INDEX = f"{PREFIX}celery:unacked_index"
CELERY_UNACKED_MUTEX = f"{PREFIX}celery:unacked_mutex"


def queue(model: str) -> str:
    """The Celery queue (a Redis list) that workers serving ``model`` consume."""
    return f"{PREFIX}queue:{model}"


def admission(model: str) -> str:
    """Hash of ``model``'s admission limit and retry hint, advertised by its workers."""
    return f"{PREFIX}admission:{model}"


def events_channel(job_id: str) -> str:
    """Pub/sub channel carrying a job's live events."""
    return f"{PREFIX}ev:{{{job_id}}}"


def event_log(job_id: str) -> str:
    """Stream holding every event of a job, for replay after a gap or a reconnect."""
    return f"{PREFIX}log:{{{job_id}}}"


def abort_flag(job_id: str) -> str:
    """Set by a client to cancel a job; checked at pickup and on control messages."""
    return f"{PREFIX}abort:{{{job_id}}}"


def job_record(job_id: str) -> str:
    """Hash with the job's payload, state, owner and attempt count (for failover)."""
    return f"{PREFIX}job:{{{job_id}}}"


def lease(job_id: str) -> str:
    """Short-lived key naming the worker that currently runs the job."""
    return f"{PREFIX}lease:{{{job_id}}}"


def requeue_marker(job_id: str) -> str:
    """Short-lived marker: one live worker is requeueing this job after its owner died."""
    return f"{PREFIX}requeue:{{{job_id}}}"


def running_jobs(model: str) -> str:
    """Sorted set of jobs being run for ``model``, scored by lease expiry (ms), for failover."""
    return f"{PREFIX}running:{model}"


def worker_heartbeat(worker_id: str) -> str:
    """A worker's heartbeat and stats (JSON), expiring when the worker stops refreshing it."""
    return f"{PREFIX}worker:{worker_id}"
