"""Giving back the messages a dead worker took and never acknowledged.

kombu keeps a delivered message in its unacknowledged hash until the worker acknowledges
it (once its job ended: ``acks_late``) and restores it to its queue only after the
visibility timeout (6 h). The worker's channel names, beside kombu's record and in the
same write, the worker that took it (``Keyspace.celery_delivered``, ``HeldQoS``). Once per
watch (``failover``), live workers look at the messages of workers whose heartbeat is gone:

- its job never claimed (its record has no state, is ``queued``, or is missing: a producer
  other than the SDK writes none): the message goes back to the front of the shared
  queue at once and its records go, in one script (exactly one live worker gives it back). The job counts as never started; taken before
  its queue deadline, its record says so (``event_log.PICKED_FIELD``), so the next pickup
  does not refuse it for the wait the death added while its caller still waits;
- its job ended (``done``): only the records go, so no late copy runs it a second time
  (a worker drops them itself as its job ends, ``drop_delivery_records``: Celery's own
  acknowledgement waits for the consumer's loop, which a reconnect holds up; a worker
  killed meanwhile would leave them to outlive the job's record);
- its job running (the dead worker claimed it; the lease takeover moves it on): left
  until the job ends, then dropped as above.

The record is read inside the script that settles the message, so a claim that lands
meanwhile is never undone.
"""

from __future__ import annotations

import base64
import json
import logging
from bisect import bisect
from typing import Any

import redis
from kombu.transport.redis import Channel

from kvrelay.keys import Keyspace
from kvrelay.queue_scripts import RESTORE_DELIVERY
from kvrelay.redis_functions import Functions
from kvrelay_worker.intake.pickup_checks import give_up_at
from kvrelay_worker.jobs.orphan_queues import priority_lists
from kvrelay_worker.jobs.store_calls import text
from kvrelay_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# ``RESTORE_DELIVERY``'s answer when the message went back to the queue.
GIVEN_BACK = 1


class DeadDeliveries:
    """Finds the unacknowledged messages of dead workers of this model and settles them."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings, scripts: Functions
                 ) -> None:
        self.redis = client
        self.keys = settings.keys
        self.model = settings.served_model
        self.max_queue_wait = settings.max_queue_wait
        self.record_ttl_s = max(1, int(settings.log_live_ttl))
        self.scripts = scripts
        # The routing keys of this model's messages: its shared queue, its workers' own.
        self.shared = self.keys.celery_queue(self.model)
        self.own_head = self.keys.celery_worker_queue(self.model, "")
        self.targets = priority_lists(self.keys.queue(self.model))

    def sweep(self) -> int:
        """Settle every message a dead worker holds; the number given back or dropped."""
        owners = {text(tag): text(worker) for tag, worker in
                  self.redis.hgetall(self.keys.celery_delivered).items()}
        if not owners:
            return 0
        workers = sorted(set(owners.values()))
        pipe = self.redis.pipeline(transaction=False)
        for worker in workers:
            pipe.exists(self.keys.worker_heartbeat(worker))
        alive = {worker for worker, found in zip(workers, pipe.execute(), strict=True) if found}
        return sum(self._settle(tag, worker) for tag, worker in owners.items()
                   if worker not in alive)

    def _settle(self, tag: str, worker: str) -> int:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.celery_unacked, tag)
        pipe.zscore(self.keys.celery_unacked_index, tag)
        raw, taken_at = pipe.execute()
        if raw is None:  # acknowledged or restored meanwhile: only the name is left
            return int(self._restore(tag, worker, "", "") > 0)
        try:
            message, _exchange, routing_key = json.loads(raw)
            job_id = str(message["headers"]["id"])
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("an unacknowledged message of dead worker %s cannot be read (%s); "
                        "kombu restores it after its visibility timeout", worker, exc)
            return 0
        if routing_key != self.shared and not str(routing_key).startswith(self.own_head):
            return 0  # another model's: its workers settle it
        message.setdefault("headers", {})["redelivered"] = True
        picked = taken_at is not None and taken_in_time(message, float(taken_at),
                                                         self.max_queue_wait)
        settled = self._restore(tag, worker, job_id, json.dumps(message), picked,
                                self.targets[priority_step(message)])
        if settled == GIVEN_BACK:
            log.warning("worker %s died holding job %s before claiming it; gave its message "
                        "back to the queue", worker, job_id)
        return int(settled > 0)

    def _restore(self, tag: str, worker: str, job_id: str, message: str,
                 picked: bool = False, target: str = "") -> int:
        """``RESTORE_DELIVERY`` ('' message: only drop); its answer."""
        record = self.keys.job_record(job_id or tag)
        return int(self.scripts.call(
            RESTORE_DELIVERY,
            [self.keys.celery_unacked, self.keys.celery_unacked_index,
             self.keys.celery_delivered, target or self.targets[0], record,
             self.keys.lease(job_id or tag)],
            [tag, worker, message, 1 if picked else 0, self.record_ttl_s]))


def drop_delivery_records(client: redis.Redis, keys: Keyspace, tag: str) -> None:
    """What an acknowledgement removes, removed by the worker whose job just ended."""
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.celery_unacked, tag)
    pipe.zrem(keys.celery_unacked_index, tag)
    pipe.hdel(keys.celery_delivered, tag)
    pipe.execute()


def priority_step(message: dict[str, Any]) -> int:
    """The index, in ``priority_lists``, of the list kombu keeps ``message`` in."""
    try:
        priority = max(min(int(message["properties"]["priority"]), Channel.max_priority),
                       Channel.min_priority)
    except (TypeError, ValueError, KeyError):
        priority = Channel.default_priority
    steps = list(Channel.priority_steps)
    return steps.index(steps[bisect(steps, priority) - 1])


def taken_in_time(message: dict[str, Any], taken_at: float, max_queue_wait: float) -> bool:
    """Whether the message was taken before its job's give-up time (False: none, or
    unreadable: the next pickup judges the wait as usual)."""
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        payload = json.loads(args[0]) if isinstance(args[0], str) else args[0]
        limit = give_up_at(payload.get("queue_deadline"),
                           float(payload.get("enqueued_at") or 0.0), max_queue_wait)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return limit is not None and taken_at <= limit
