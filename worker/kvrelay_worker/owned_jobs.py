"""``OwnedJobs``: the one registry of the jobs this worker holds, and what may end them.

A task thread ``hold``s a job while it runs; anyone may ``abort`` (the caller cancelled),
``fence`` (another worker owns the job now) or ``hand_back`` (shutdown) a held job, each
turned into an engine abort with its reason. When the job leaves the registry its lease
is ``release``d in Redis if the job really ended here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kvrelay_worker.active_job import ENDED_HERE, ActiveJob, Outcome
from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.job_store import JobStore

log = logging.getLogger(__name__)


class OwnedJobs:
    """The jobs this worker holds, by id; safe to use from any thread."""

    def __init__(self, service: EngineService, store: JobStore) -> None:
        self._service = service
        self._store = store
        self._jobs: dict[str, ActiveJob] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._jobs)

    def jobs(self) -> list[ActiveJob]:
        with self._lock:
            return list(self._jobs.values())

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    @contextmanager
    def hold(self, job: ActiveJob) -> Iterator[ActiveJob]:
        """Register ``job`` for the block's duration, then release it."""
        with self._lock:
            self._jobs[job.job_id] = job
        try:
            yield job
        finally:
            with self._lock:
                self._jobs.pop(job.job_id, None)
        self.release(job)

    def release(self, job: ActiveJob) -> None:
        """Mark the job done in Redis (lease dropped) if it ended on this worker, unless
        the batch that wrote its terminal event already did.

        If Redis refuses, the lease simply expires: failover requeues the job, and its
        next claim finds the terminal event in the log and ends it as a duplicate.
        """
        if job.outcome not in ENDED_HERE or job.released:
            return
        try:
            self._store.release_done(job.job_id)
        except redis.RedisError as exc:
            log.warning("could not mark job %s done (%s); its lease will expire", job.job_id,
                        exc)

    def abort(self, job_id: str) -> None:
        """The caller cancelled: stop the job (its ``cancelled`` event follows)."""
        self._stop(job_id, Outcome.CANCELLED)

    def fence(self, job_id: str) -> None:
        """Another worker owns the job now: stop it here, writing nothing more."""
        self._stop(job_id, Outcome.FENCED)

    def hand_back(self, job_id: str) -> None:
        """Shutting down: stop the job and give it back to the queue."""
        self._stop(job_id, Outcome.HANDBACK)

    def _stop(self, job_id: str, reason: str) -> None:
        if job_id in self._jobs:
            self._service.abort(job_id, reason)
