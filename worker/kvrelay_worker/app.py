"""The Celery app of a kvrelay worker: ``celery -A kvrelay_worker.app worker``.

Configuration comes from ``KVRELAY_*`` variables (see ``settings``), read when this
module is imported. The engine is created by a worker bootstep before the consumer
starts, so no job is taken before the model is loaded, and stopped (gracefully) on
shutdown. Pickle is never accepted: requests travel as JSON.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from celery import Celery, bootsteps, signals
from celery.exceptions import Reject
from kombu import Exchange, Queue

from kvrelay.enqueue import celery_broker_settings
from kvrelay.protocol import TASK_NAME
from kvrelay.sentinel_url import is_sentinel_url
from kvrelay.tls import celery_ssl_options
from kvrelay_worker import broker_transport, fast_exit
from kvrelay_worker.intake.payload_gate import size_gated
from kvrelay_worker.jobs.job_copy import send_job_copy
from kvrelay_worker.runtime import WorkerRuntime
from kvrelay_worker.settings import WorkerSettings
from kvrelay_worker.vital_threads import exit_for_dead_thread

log = logging.getLogger(__name__)

settings = WorkerSettings.from_env()
QUEUE = settings.keys.celery_queue(settings.served_model)


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def make_celery(s: WorkerSettings) -> Celery:
    celery_app = Celery("kvrelay_worker")
    queue_name = s.keys.celery_queue(s.served_model)
    # redis+sentinel://: kombu's Sentinel transport, asking the sentinels for the primary.
    broker_url, broker_options = celery_broker_settings(s.redis_url)
    if is_sentinel_url(s.redis_url):
        broker_transport.own_the_sentinel_scheme()
    celery_app.conf.update(
        broker_url=broker_url,
        # kombu's transport with a channel that can restore unacked messages after its
        # connection closed (``broker_transport``).
        broker_transport=(broker_transport.SENTINEL_TRANSPORT if is_sentinel_url(s.redis_url)
                          else broker_transport.REDIS_TRANSPORT),
        # rediss://: verify the broker's certificate as every other connection does.
        broker_use_ssl=celery_ssl_options(s.redis_url),
        broker_connection_retry_on_startup=True,
        # An error reply from the broker (NOREPLICAS, MISCONF, READONLY, BUSY, ...: Redis
        # refusing writes for a while) restarts the consumer, as a lost connection does,
        # instead of stopping the worker and every job it runs.
        broker_channel_error_retry=True,
        # A lost broker connection leaves running jobs running: their leases, not Celery's
        # redelivery, decide who continues them (a cancelled task would lose its run).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_transport_options={
            "visibility_timeout": s.visibility_timeout,
            "unacked_restore_interval": s.unacked_restore_interval,
            "unacked_restore_throttle": s.unacked_restore_throttle,
            **s.keys.celery_transport_options(),
            **broker_options,
            # Whose the messages this worker takes are (``broker_transport.HeldQoS``).
            broker_transport.DELIVERED_KEY_OPTION:
                s.keys.celery_delivered[len(s.keys.celery_key_prefix):],
            broker_transport.WORKER_ID_OPTION: s.worker_id,
            # kombu's blocking pops time out after a second; these bound everything else.
            "socket_timeout": s.redis_socket_timeout,
            "socket_connect_timeout": s.redis_socket_timeout,
        },
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_pool="threads",
        worker_concurrency=s.concurrency,
        worker_hijack_root_logger=False,
        # Remote control listens with PSUBSCRIBE, which a tenant's ACL (&<prefix>*) cannot
        # allow: a namespaced worker goes without it (its registry is kvrelay's own).
        worker_enable_remote_control=not s.namespace,
        # Fails (and counts) messages that are not JSON instead of only logging them.
        worker_consumer="kvrelay_worker.intake.undecodable_messages:KvrelayConsumer",
        task_default_queue=queue_name,
        task_queues=(_queue(queue_name),),
    )
    return celery_app


app = make_celery(settings)


@signals.celeryd_after_setup.connect
def _consume_own_queue(sender: object = None, instance: Any = None, **_: object) -> None:
    """Consume this worker's own queue (prefix-aware placement) beside the shared one,
    whatever ``--queues`` said: its name holds the worker id, known only in here."""
    global _consumes_own_queue
    if instance is not None:
        instance.app.amqp.queues.select_add(
            _queue(settings.keys.celery_worker_queue(settings.served_model, settings.worker_id)))
        _consumes_own_queue = True


# Only a worker that consumes its own queue advertises prefixes (placement picks it).
_consumes_own_queue = False
_runtime: WorkerRuntime | None = None


def current_runtime() -> WorkerRuntime | None:
    """The running worker's runtime (None before the engine is loaded, or after shutdown)."""
    return _runtime


@signals.worker_ready.connect
def _mark_consuming(sender: object = None, **_: object) -> None:
    """Celery's consumer has started on the model's queue (the engine was loaded before it,
    by ``EngineBootstep``): from now on ``/ready`` may say ready."""
    if _runtime is not None:
        _runtime.probes.consuming()


def requeue(job_id: str, payload_json: str) -> None:
    """Put a copy of a job back on its model's queue (failover and hand-back)."""
    send_job_copy(app, QUEUE, job_id, payload_json)


class EngineBootstep(bootsteps.StartStopStep):
    """Loads the engine before the consumer starts; drains it on shutdown."""

    requires: ClassVar[set[str]] = {"celery.worker.components:Pool"}

    def start(self, worker: Any) -> None:
        global _runtime
        if _runtime is None:
            _runtime = WorkerRuntime(settings, requeue=requeue,
                                     own_queue=_consumes_own_queue,
                                     on_thread_death=exit_for_dead_thread)
            _runtime.start()

    def stop(self, worker: Any) -> None:
        global _runtime
        if _runtime is not None:
            _runtime.shutdown()
            _runtime = None

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)


app.steps["worker"].add(EngineBootstep)
fast_exit.install()


def _refuse_oversized(job_id: str | None, size: int) -> bool:
    runtime = _runtime
    if runtime is None:
        return False  # not running: the message goes back to the queue
    runtime.refuse_oversized(job_id, size)
    return True


@app.task(name=TASK_NAME, bind=True,
          Strategy=staticmethod(size_gated(settings.max_payload_bytes, _refuse_oversized)))
def generate(self: Any, payload: object = None, *args: object, **kwargs: object) -> str:
    runtime = _runtime
    if runtime is None:
        # Not ready (or shutting down): give the message back to the queue untouched.
        raise Reject("the engine is not running", requeue=True)
    if args or kwargs:
        outcome = runtime.reject(self.request.id,
                                 "the task takes exactly one argument, the request")
    else:
        outcome = runtime.run_job(self.request.id, payload)
    # Celery acknowledges later, from its consumer's loop (held up while it reconnects):
    # the message's records go now, so a death before that leaves none behind.
    runtime.drop_delivery(_delivery_tag(self.request))
    return outcome


def _delivery_tag(request: Any) -> str | None:
    """kombu's tag of the message a task came in (None: not delivered by a broker)."""
    properties = getattr(request, "properties", None) or {}
    tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
    return str(tag) if tag else None
