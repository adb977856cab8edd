"""Where a Celery message lands in a model's queue: admitted under a limit, or at the front.

kombu's Redis transport pushes with LPUSH and consumers pop with BRPOP, so the right end
of the list is the one workers take next. Two kinds of push, each one Redis call:

- ``admit``: a new job is pushed (LPUSH, the back) only while the model's backlog (its
  shared queue and every worker queue of it) holds fewer jobs than its limit, and its
  tenant is within its quota when it has one, checked, counted and pushed in one Lua
  script, so clients racing each other can never overfill it. The limit is what the
  model's workers advertise (``KVRELAY_MAX_QUEUE``, in ``Keyspace.queue_limit(model)``), lowered by a client's own
  ``max_queue``. A refusal carries the workers' retry hint.
- ``front``: a job taken over from a dead worker (or handed back by one shutting down)
  is pushed with RPUSH, so it is the next one a worker pops: its caller is waiting.

kombu has no hook for either, so its Redis channel's ``_put`` is wrapped once per process;
without a push mode active on the calling thread the wrapper is kombu's own ``_put``.
Priorities would use other lists (``queue<sep>pri``); kvrelay sends none, so a job's list
is the queue's own.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import redis

from kvrelay.keys import Keyspace
from kvrelay.lua_library import LIBRARY
from kvrelay.queue_scripts import ADMIT
from kvrelay.redis_functions import Functions, has_functions, is_missing
from kvrelay.replica_wait import ReplicaWait
from kvrelay.sentinel_url import WAIT_REPLICAS_OPTION, WAIT_TIMEOUT_OPTION
from kvrelay.tenant_quota import TenantQuota, retry_after_for_rate

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "MAX_QUEUE_TIMEOUT_S",
    "AdmissionRefused",
    "ChannelClosed",
    "at_front",
    "publish_task",
    "queue_limit_fields",
    "task_argsrepr",
]

# The longest queue wait a caller may ask for: shorter than the abort flag's lifetime
# (``ABORT_FLAG_TTL_S``, one hour), so a job whose caller gave up is still marked aborted
# whenever a worker could pick it up. Workers cap older payloads the same way.
MAX_QUEUE_TIMEOUT_S: Final = 3000.0
# Retry hint when no worker advertised one (a client-side ``max_queue`` refused).
DEFAULT_RETRY_AFTER_S: Final = 1.0



# What each refusal of ``_ADMIT`` says (its first reply).
_REFUSALS: Final = {
    0: "the queue of model {model!r} holds {count} jobs, its limit is {limit}",
    2: "tenant {tenant!r} has {count} jobs in flight, its limit is {limit}",
    3: "tenant {tenant!r} has {count} jobs waiting, its limit is {limit}",
    4: "tenant {tenant!r} is over its rate of {rate:g} jobs per second",
}


class AdmissionRefused(Exception):
    """The queue was full, or the tenant over its quota: nothing was pushed."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class ChannelClosed(redis.ConnectionError):
    """kombu closed the channel a push was handed (its connection was collected, as a
    failover's reconnect does): nothing was sent. A connection error of kombu's Redis
    transport (``Transport.connection_errors``), so the publish's ``ensure`` (Celery's
    publish retry) reconnects and pushes again on a new channel; past its retries the SDK
    reports it as any broken broker connection (``BrokerUnavailable``)."""


@dataclass(slots=True)
class _Push:
    """How this thread's next kombu push lands: at the front, or admitted under a limit."""

    front: bool
    limit_key: str
    cap: int | None
    # The model's shared queue, its worker-queues set and its worker queues' name prefix.
    backlog: tuple[str, str, str] = ("", "", "")
    model: str = ""
    job_id: str = ""
    quota: TenantQuota | None = None
    counted_until: float = 0.0
    tenant_keys: tuple[str, str, str] = ("", "", "")
    running: str = ""
    namespace: str = ""
    # The job's record, marked enqueued by the push (``event_log.ENQUEUED_FIELD``).
    record: str = ""
    # The model's set of jobs not claimed yet (``Keyspace.fresh_jobs``).
    fresh: str = ""


_local = threading.local()
_install_lock = threading.Lock()


def queue_limit_fields(max_queue: int, retry_after: float,
                       claim_due_ms: int | None = None) -> dict[str, str]:
    """The queue-limit hash a worker advertises (``max_queue`` <= 0: no server limit;
    ``claim_due_ms``: when the watch looks for the message of a job still unclaimed)."""
    fields = {"retry_after": repr(float(retry_after))}
    if claim_due_ms is not None:
        fields["claim_due_ms"] = str(int(claim_due_ms))
    if max_queue > 0:
        fields["max_queue"] = str(int(max_queue))
    return fields


def task_argsrepr(job_id: str) -> str:
    """What a task message's ``argsrepr`` header shows instead of the request.

    Celery would otherwise repeat the payload (the prompt) as text in the headers, which
    monitoring tools (Flower, ``celery events``) display and store.
    """
    return f"[<kvrelay job {job_id}>]"


def publish_task(
    app: Any,
    name: str,
    payload: dict[str, Any],
    *,
    task_id: str,
    keys: Keyspace,
    model: str,
    max_queue: int | None = None,
    queue: str | None = None,
    quota: TenantQuota | None = None,
    counted_until: float = 0.0,
) -> None:
    """``app.send_task`` to ``model``'s queue with a push mode (blocking; raises
    ``AdmissionRefused`` when an ``admit`` finds the backlog full or the tenant over
    ``quota``, whose counts of this job last until ``counted_until``, unix s).

    ``max_queue`` is the caller's own limit ("refuse while more than this many wait");
    ``queue`` a worker's own Celery queue instead of the shared one
    (``kvrelay.prefix_placement``).
    """
    _install()
    cap = None if max_queue is None else max_queue + 1
    tenant = quota.tenant if quota is not None else ""
    push = _Push(
        front=False, limit_key=keys.queue_limit(model), cap=cap,
        backlog=(keys.queue(model), keys.worker_queues(model), keys.worker_queue(model, "")),
        model=model, job_id=task_id, quota=quota, counted_until=counted_until,
        tenant_keys=(keys.tenant_jobs(tenant), keys.tenant_queued(tenant),
                     keys.tenant_rate(tenant)),
        running=keys.running_jobs(model), namespace=keys.namespace,
        record=keys.job_record(task_id), fresh=keys.fresh_jobs(model))
    with _pushing(push):
        app.send_task(
            name,
            args=[payload],
            task_id=task_id,
            queue=queue or keys.celery_queue(model),
            serializer="json",
            ignore_result=True,
            argsrepr=task_argsrepr(task_id),
            kwargsrepr="{}",
        )


def _retry_after(raw: object) -> float:
    """The advertised hint, or the default when it is missing or not a sane number."""
    try:
        hint = float(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    return hint if math.isfinite(hint) and hint > 0 else DEFAULT_RETRY_AFTER_S


@contextlib.contextmanager
def at_front() -> Iterator[None]:
    """Within: this thread's kombu pushes go to the front of their queue (RPUSH)."""
    _install()
    with _pushing(_Push(front=True, limit_key="", cap=None)):
        yield


@contextlib.contextmanager
def _pushing(push: _Push) -> Iterator[None]:
    previous = getattr(_local, "push", None)
    _local.push = push
    try:
        yield
    finally:
        _local.push = previous


_replica_waits: dict[tuple[int, int], ReplicaWait] = {}
# Per kombu connection pool: whether its server has Redis Functions (asked once).
_has_functions: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _scripts(client: Any, namespace: str) -> Functions:
    """The admission script's caller on ``client``; the default namespace's client loads
    the library where it is missing, a tenant's may not."""
    pool = client.connection_pool
    with _install_lock:
        known = _has_functions.get(pool)
    if known is None:
        known = has_functions(client)
        with _install_lock:
            _has_functions[pool] = known
    return Functions(client, LIBRARY, namespace=namespace, may_load=not namespace,
                     functions=known)


def _replica_wait(transport_options: dict[str, Any]) -> ReplicaWait:
    """The process's ``ReplicaWait`` for a broker's WAIT settings (sentinel mode; none
    elsewhere), shared by its connections: a primary's missing replica is noticed once
    for all of them (it keeps that per primary)."""
    replicas = int(transport_options.get(WAIT_REPLICAS_OPTION, 0))
    timeout_ms = int(transport_options.get(WAIT_TIMEOUT_OPTION, 0))
    with _install_lock:
        return _replica_waits.setdefault((replicas, timeout_ms),
                                         ReplicaWait(replicas, timeout_ms))


def _closed(queue: str) -> ChannelClosed:
    return ChannelClosed(
        f"the broker channel was closed (its connection was reset) before the push to "
        f"{queue!r}; nothing was sent (a publish retry reconnects and pushes again)")


def _transport_options(channel: Any, queue: str) -> dict[str, Any]:
    """The broker's transport options, through the channel's transport to its kombu
    connection. A closed channel has neither (kombu sets ``channel.connection`` to None,
    a collected connection its transport's ``client``); nothing of it survives the close
    that a push could use (its Redis pool is gone too): ``ChannelClosed``."""
    transport = getattr(channel, "connection", None)
    conninfo = getattr(transport, "client", None)
    if conninfo is None:
        raise _closed(queue)
    options: dict[str, Any] = conninfo.transport_options
    return options


def _redis_client(stack: contextlib.ExitStack, channel: Any, queue: str) -> Any:
    """The channel's Redis client for one push, held by ``stack``; ``ChannelClosed``
    when kombu closes the channel meanwhile (its pool rebuilt from a missing connection
    fails with an ``AttributeError``)."""
    try:
        return stack.enter_context(channel.conn_or_acquire())
    except AttributeError as exc:
        if getattr(getattr(channel, "connection", None), "client", None) is not None:
            raise
        raise _closed(queue) from exc


def _install() -> None:
    """Wrap kombu's Redis ``Channel._put`` (once per process)."""
    from kombu.transport import redis as kombu_redis
    from kombu.utils.json import dumps

    channel_cls: Any = kombu_redis.Channel
    with _install_lock:
        if getattr(channel_cls, "_kvrelay_queue_push", False):
            return
        original = channel_cls._put

        def _put(channel: Any, queue: str, message: Any, **kwargs: Any) -> Any:
            push: _Push | None = getattr(_local, "push", None)
            if push is None or "_publish_batch" in kwargs:
                return original(channel, queue, message, **kwargs)
            key = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
            replica_wait = _replica_wait(_transport_options(channel, queue))
            with contextlib.ExitStack() as stack:
                client = _redis_client(stack, channel, queue)
                # One connection for the push and the WAIT that follows it (sentinel mode):
                # the job is taken as enqueued only once a replica holds it too, and a
                # short WAIT is judged by the server that took the push.
                for attempt in range(2):
                    pipe = client.pipeline(transaction=False)
                    if push.front:
                        pipe.rpush(key, dumps(message))
                    else:
                        scripts = _scripts(client, push.namespace)
                        cap = "" if push.cap is None else str(push.cap)
                        # kombu prefixes a namespace's list names (``global_keyprefix``)
                        # in the commands it knows, FCALL not among them: the script gets
                        # the full name.
                        queue_key = (getattr(channel, "global_keyprefix", "") or "") + key
                        quota = push.quota
                        shared, registry, worker_prefix = push.backlog
                        scripts.queue(
                            pipe, ADMIT,
                            [queue_key, push.limit_key, shared, registry,
                             *push.tenant_keys, push.running, push.record, push.fresh],
                            [dumps(message), cap, worker_prefix,
                             push.job_id if quota is not None else "",
                             repr(push.counted_until),
                             *(quota.script_args() if quota is not None
                               else ["", "", "", "1"]), push.job_id])
                    replies = replica_wait.execute(pipe, raise_on_error=False)
                    if attempt == 0 and not push.front and is_missing(replies[0]):
                        scripts.load()  # the server lost them (restart): once more
                        continue
                    for reply in replies:
                        if isinstance(reply, Exception):
                            raise reply
                    break
                result = replies[0]
            if push.front:
                return None
            code = int(result[0])
            if code == 1:
                return None
            quota = push.quota
            reason = _REFUSALS.get(code, _REFUSALS[0]).format(
                model=push.model, count=int(result[1]), limit=int(result[2]),
                tenant=quota.tenant if quota else "",
                rate=(quota.requests_per_second or 0.0) if quota else 0.0)
            if code == 4:
                raise AdmissionRefused(reason, retry_after_for_rate(float(result[3])))
            raise AdmissionRefused(reason, _retry_after(result[3]))

        channel_cls._put = _put
        channel_cls._kvrelay_queue_push = True
