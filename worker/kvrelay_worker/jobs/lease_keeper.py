"""Lease upkeep for the jobs this worker holds, once per ``lease_refresh``.

Extends the lease of every held job's run that is moving: one the engine holds (running,
queued in the engine, preempted) while its loop goes round, or whose events the
publisher is writing (or trying to, while Redis refuses). A job that stopped moving for
``stall_timeout`` (a step that never returns, a publisher stuck or gone) keeps no
lease: another worker takes it over, instead of its stream hanging for good.

A job whose lease was taken is fenced (another run owns it now); a job whose abort flag
is set is aborted (in case the control message was missed); a job whose record is gone
(Redis restarted without persistence) is registered again, not stopped. A lease that
ran out while Redis was out of reach is taken back (if nobody claimed the job
meanwhile): after a failed refresh the next comes a fifth of a period later, so an owner
is back before any watcher judges its leases. Taking over other workers' jobs is
``failover``'s business.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvrelay.protocol import request_digest
from kvrelay_worker.jobs.active_job import ActiveJob
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.owned_jobs import OwnedJobs
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, store: JobStore, settings: WorkerSettings, jobs: OwnedJobs,
                 health: RedisHealth | None = None,
                 publisher_stuck_for: Callable[[float], float] | None = None) -> None:
        self.store = store
        self.jobs = jobs
        self.health = health
        self.period = settings.lease_refresh
        self.stall_timeout = settings.stall_timeout
        # How long the publisher has been stuck at a monotonic time (``Publisher.stuck_for``).
        self.publisher_stuck_for = publisher_stuck_for or (lambda now: 0.0)
        self._thread = Periodic("kvrelay-leases", self.period / 5, self._tick)
        self._next_at = 0.0
        # Jobs whose lease this worker stopped keeping (logged once each).
        self._let_go: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _tick(self) -> None:
        """Refresh once a period, or at the next tick after a failed refresh."""
        now = time.monotonic()
        if now < self._next_at:
            return
        try:
            self.refresh()
        except Exception:
            if self.health is not None:
                self.health.failed()
            raise
        self._next_at = now + self.period

    def moving(self, held: list[ActiveJob], now: float) -> list[ActiveJob]:
        """The held jobs whose lease is kept: all that moved within ``stall_timeout``,
        none while the publisher is stuck (what they produce would never be written)."""
        if self.publisher_stuck_for(now) > self.stall_timeout:
            return []
        return [job for job in held if now - job.progress_at <= self.stall_timeout]

    def refresh(self) -> None:
        held = self.jobs.jobs()
        kept = self.moving(held, time.monotonic())
        self._note_let_go(held, kept)
        by_id = {job.job_id: job for job in kept}
        found = self.store.refresh_held(list(by_id),
                                        [job.run_id or self.store.worker_id for job in kept])
        for job_id in found.lost:
            self.jobs.fence(job_id)
        for job_id in found.aborted:
            self.jobs.abort(job_id)
        for job_id in found.vanished:
            self._register_again(by_id[job_id])

    def _register_again(self, job: ActiveJob) -> None:
        """A held job whose record Redis lost goes on, recorded again as this run's."""
        if self.store.reregister(job.job_id, job.run_id, job.payload_json,
                                 request_digest(job.request), job.attempt):
            log.warning("job %s's record was gone from Redis (restarted without its data?); "
                        "registered it again and kept running it", job.job_id)
        else:
            self.jobs.fence(job.job_id)

    def _note_let_go(self, held: list[ActiveJob], kept: list[ActiveJob]) -> None:
        kept_ids = {job.job_id for job in kept}
        for job in held:
            if job.job_id not in kept_ids and job.job_id not in self._let_go:
                log.error("job %s has not moved for over %.0fs (engine step or event writes "
                          "stuck); its lease is no longer kept, another worker takes it over",
                          job.job_id, self.stall_timeout)
        self._let_go = {job.job_id for job in held} - kept_ids
