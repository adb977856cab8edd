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

from kvrelay_worker.engine_service import EngineService
from kvrelay_worker.jobs.active_job import ENDED_HERE, ActiveJob, Outcome
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.redis_health import RedisHealth

log = logging.getLogger(__name__)

# How long a new run of a job waits for this worker's earlier run of it to stop.
_DISPLACE_WAIT_S = 30.0


class OwnedJobs:
    """The jobs this worker holds, by id; safe to use from any thread."""

    def __init__(self, service: EngineService, store: JobStore,
                 health: RedisHealth | None = None) -> None:
        self._service = service
        self._store = store
        self._health = health
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
    def hold(self, job: ActiveJob) -> Iterator[bool]:
        """Register ``job`` for the block's duration, then release it. Yields whether this
        run may start: False when a later claim of the same job reached this worker too
        (that claim fenced this run in Redis; the run ends ``fenced`` without starting).

        An earlier run of the same job still held here (this worker stalled past the
        lease and has just claimed the job again) is fenced first and waited for: the
        engine holds one request per job. The newest claim is registered at once, so
        the lease keeper keeps its lease while it waits (an unkept lease would expire
        and the job be requeued, and claimed again, behind it)."""
        with self._lock:
            earlier = self._jobs.get(job.job_id)
            superseded = earlier is not None and earlier.attempt > job.attempt
            if not superseded:
                self._jobs[job.job_id] = job
        try:
            if earlier is not None and not superseded:
                self._displace(earlier)
            with self._lock:
                holds = self._jobs.get(job.job_id) is job
            if not holds:
                log.info("job %s was claimed again while its run here waited to start; "
                         "that later claim runs it", job.job_id)
                job.finish(Outcome.FENCED)
            yield holds
        finally:
            with self._lock:
                if self._jobs.get(job.job_id) is job:
                    del self._jobs[job.job_id]
        self.release(job)

    def _displace(self, earlier: ActiveJob) -> None:
        """Stop ``earlier``, the run of the same job this worker held until now."""
        log.warning("job %s was claimed again by this worker (it stalled past the lease); "
                    "stopping its earlier run", earlier.job_id)
        self._service.abort(earlier.job_id, Outcome.FENCED)
        if not earlier.done.wait(_DISPLACE_WAIT_S):
            log.error("the earlier run of job %s did not stop within %.0fs", earlier.job_id,
                      _DISPLACE_WAIT_S)

    def release(self, job: ActiveJob) -> None:
        """Mark the job done in Redis (lease dropped) if it ended on this worker, unless
        the batch that wrote its terminal event already did; held and retried while
        Redis refuses (the job's Celery message stays unacknowledged meanwhile).
        """
        if job.outcome not in ENDED_HERE or job.released:
            return
        try:
            until_written(lambda: self._store.release_done(job.job_id, job.run_id),
                          f"the end of job {job.job_id}", self._health)
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
