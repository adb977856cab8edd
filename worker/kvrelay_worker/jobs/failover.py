"""Taking over the jobs of dead workers, once per ``watchdog_interval``.

Looks for jobs of this model whose owner stopped refreshing its lease and requeues each
(exactly one live worker wins each job), so a worker death costs about one lease period,
not Celery's visibility timeout. A job that lost too many workers fails ``worker_lost``.
The same watch moves the jobs waiting in dead workers' own queues (``orphan_queues``)
onto the shared queue, gives back the messages dead workers took and never claimed
(``dead_deliveries``), and pushes again the copy of a job left ``queued`` that nobody
claimed by its due time and that waits nowhere (``queued_copies``), and the message of a
job admitted and never claimed that was lost on its way to a worker (``fresh_watch``): no
job waits on a record nobody will touch. It also drops the unacknowledged records of
messages whose job ended, whoever holds them (``ended_deliveries``).

A lease is judged on time Redis was reachable: after any failed write of this worker
(Redis refusing writes or failing over) the watch takes nothing over until its writes have
gone through for a whole lease period, in which live owners refresh or take back leases
that ran out during the outage. So an outage shorter than that takes over nothing, and
a real death still costs about one lease period.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from kvrelay.protocol import ErrorCode, Failed
from kvrelay_worker.intake.job_request import reply_to_of
from kvrelay_worker.jobs.dead_deliveries import DeadDeliveries
from kvrelay_worker.jobs.ended_deliveries import EndedDeliveries
from kvrelay_worker.jobs.fresh_watch import FreshWatch
from kvrelay_worker.jobs.held_writes import until_written
from kvrelay_worker.jobs.job_store import JobStore
from kvrelay_worker.jobs.orphan_queues import OrphanQueues
from kvrelay_worker.jobs.queued_copies import has_copy
from kvrelay_worker.periodic import Periodic
from kvrelay_worker.redis_health import RedisHealth
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# How long before an outage's first failed write an ending may have been lost: an AOF
# fsync period, a replica's lag, and what this worker noticed late (beyond a lease).
REASSERT_MARGIN_S = 5.0

# Puts a copy of a job (id, payload JSON) back on its model's queue.
Requeue = Callable[[str, str], None]


class Failover:
    def __init__(self, store: JobStore, settings: WorkerSettings, requeue: Requeue,
                 orphans: OrphanQueues | None = None, health: RedisHealth | None = None
                 ) -> None:
        self.store = store
        self.orphans = orphans
        self.requeue = requeue
        self.max_attempts = settings.max_attempts
        self.lease_ttl = settings.lease_ttl
        self.health = health or RedisHealth()
        self.deliveries = DeadDeliveries(store.redis, settings, store.scripts)
        self.fresh = FreshWatch(store, settings.served_model, settings.max_queue_wait)
        self.ended = EndedDeliveries(store.redis, store.keys, store.scripts)
        self._reasserted_for: float | None = None
        self._outage_began: float | None = None
        self._server_id: str | None = None
        self._identity_readable = True
        self.model = settings.served_model
        self._thread = Periodic("kvrelay-failover", settings.watchdog_interval,
                                self.take_over_expired, self.health)

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
        if self._server_replaced():
            # As after an outage: owners take their leases back and write again the ends
            # it lost before any job is taken over.
            self.health.failed()
        self._reassert_endings()
        if self.orphans is not None:
            try:
                self.orphans.sweep()
            except Exception as exc:  # the lease takeover below must still run
                log.warning("could not move dead workers' queued jobs (%s)", exc)
        if self.health.writable_for() < self.lease_ttl:
            return  # just back from an outage: owners are still taking their leases back
        try:  # (heartbeats lapse in an outage too: judged, like leases, after it)
            self.deliveries.sweep()
        except Exception as exc:  # the lease takeover below must still run
            log.warning("could not give back dead workers' unclaimed messages (%s)", exc)
        try:
            self.ended.sweep()
        except Exception as exc:  # the lease takeover below must still run
            log.warning("could not drop the delivery records of ended jobs (%s)", exc)
        try:
            self.fresh.sweep()
        except Exception as exc:  # the lease takeover below must still run
            log.warning("could not look for the messages of unclaimed jobs (%s)", exc)
        for job_id in self.store.expired_candidates():
            self._take_over(job_id)

    def _server_replaced(self) -> bool:
        """Whether Redis is another server, or the same one restarted, since the last
        look (its ``run_id``): a restart that lost writes can be quick enough that no
        write of this worker failed, and the leases it brings back have lapsed. A user
        that may not run ``INFO`` (a tenant's) relies on failed writes alone."""
        if not self._identity_readable:
            return False
        try:
            run_id = str(self.store.redis.info("server").get("run_id", ""))
        except redis.exceptions.NoPermissionError:
            self._identity_readable = False
            log.info("this Redis user may not run INFO: a restart is noticed by failed "
                     "writes only")
            return False
        replaced = self._server_id is not None and run_id != self._server_id
        self._server_id = run_id
        return replaced

    def _reassert_endings(self) -> None:
        """After a failed write, once writes get through again: the ends of the jobs this
        worker ended shortly before the failure, written again (``recent_endings``): a
        restart or failover may have lost them, and a watch would hand the job out again."""
        failure = self.health.last_failure()
        if failure is None or failure == self._reasserted_for:
            return
        if self._outage_began is None:  # the first failure seen of this outage
            self._outage_began = failure
        ended = self.store.endings.since(self._outage_began - self.lease_ttl - REASSERT_MARGIN_S)
        for job_id, run, at in ended:  # a failed write raises: tried again next time
            lost = at + self.store.ended_ttl_s > self._outage_began
            if self.store.reassert_end(job_id, run, lost) == 1:
                log.warning("job %s had ended here, but Redis had lost its end (a restart "
                            "or failover); wrote it again", job_id)
        if self.ended.drop_jobs({job_id for job_id, _, _ in ended}):
            log.warning("dropped unacknowledged messages of jobs that had ended here (a "
                        "restart or failover brought them back)")
        self._reasserted_for, self._outage_began = failure, None

    def _take_over(self, job_id: str) -> None:
        status, payload, lost_run = self.store.check_expired(job_id)
        if status == "requeue" and payload is not None:
            log.warning("job %s lost its worker; requeueing it", job_id)
            until_written(lambda: self.requeue(job_id, payload), f"the copy of job {job_id}",
                          self.health)
            until_written(lambda: self.store.commit_requeue(job_id, lost_run),
                          f"the requeue of job {job_id}", self.health)
        elif status == "queued":
            self._push_lost_copy(job_id, payload)
        elif status == "exhausted":
            log.warning("job %s lost %d workers; failing it", job_id, self.max_attempts)
            failed = Failed(
                seq=0, code=ErrorCode.WORKER_LOST,
                message=f"workers died {self.max_attempts} times while running this job")
            reply_to = reply_to_of(payload) if payload is not None else ""
            # Its record already says done: this is the job's only chance of an end.
            until_written(lambda: self.store.append_unowned(job_id, failed, reply_to=reply_to),
                          f"the end of job {job_id}", self.health)

    def _push_lost_copy(self, job_id: str, payload: str | None) -> None:
        """A job left ``queued`` was not claimed by its due time: push a copy unless one
        waits somewhere, then make it due again (a duplicate is dropped by the claim)."""
        if payload is not None and not has_copy(self.store.redis, self.store.keys, self.model,
                                                job_id):
            log.warning("job %s is queued but no copy of it waits anywhere; pushing one",
                        job_id)
            until_written(lambda: self.requeue(job_id, payload), f"the copy of job {job_id}",
                          self.health)
        until_written(lambda: self.store.rearm_queued(job_id), f"the watch of job {job_id}",
                      self.health)
