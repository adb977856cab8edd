"""Taking over the jobs of dead workers, once per ``watchdog_interval``.

Looks for jobs of this model whose owner stopped refreshing its lease and requeues each
(exactly one live worker wins each job), so a worker death costs about one lease period,
not Celery's visibility timeout. A job that lost too many workers fails ``worker_lost``.
The same watch moves the jobs waiting in dead workers' own queues (``orphan_queues``)
onto the shared queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvrelay.protocol import ErrorCode, Failed
from kvrelay_worker.job_request import reply_to_of
from kvrelay_worker.job_store import JobStore
from kvrelay_worker.orphan_queues import OrphanQueues
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# Puts a copy of a job (id, payload JSON) back on its model's queue.
Requeue = Callable[[str, str], None]


class Failover:
    def __init__(self, store: JobStore, settings: WorkerSettings, requeue: Requeue,
                 orphans: OrphanQueues | None = None) -> None:
        self.store = store
        self.orphans = orphans
        self.requeue = requeue
        self.max_attempts = settings.max_attempts
        self._thread = Periodic("kvrelay-failover", settings.watchdog_interval,
                                self.take_over_expired)

    def start(self) -> None:
        # Before this worker's consumer starts: jobs of dead workers go to the queue's front.
        try:
            self.take_over_expired()
        except Exception as exc:
            log.warning("could not look for jobs of dead workers at start (%s)", exc)
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def take_over_expired(self) -> None:
        """Requeue jobs of dead workers (each claimed atomically, so only one requeues it)
        and move the jobs waiting in their own queues to the shared queue."""
        if self.orphans is not None:
            try:
                self.orphans.sweep()
            except Exception as exc:  # the lease takeover below must still run
                log.warning("could not move dead workers' queued jobs (%s)", exc)
        for job_id in self.store.expired_candidates():
            status, payload = self.store.check_expired(job_id)
            if status == "requeue" and payload is not None:
                log.warning("job %s lost its worker; requeueing it", job_id)
                self.requeue(job_id, payload)
                self.store.commit_requeue(job_id)
            elif status == "exhausted":
                log.warning("job %s lost %d workers; failing it", job_id, self.max_attempts)
                self.store.append_unowned(job_id, Failed(
                    seq=0, code=ErrorCode.WORKER_LOST,
                    message=f"workers died {self.max_attempts} times while running this job",
                ), reply_to=reply_to_of(payload) if payload is not None else "")
