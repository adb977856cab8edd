"""Where a Celery message lands in a model's queue: admitted under a limit, or at the front.

kombu's Redis transport pushes with LPUSH and consumers pop with BRPOP, so the right end
of the list is the one workers take next. Two placements, each one Redis call:

- ``admit``: a new job is pushed (LPUSH, the back) only while the queue holds fewer
  jobs than its limit, checked and pushed in one Lua script, so clients racing each
  other can never overfill it. The limit is what the model's workers advertise
  (``KVRELAY_MAX_QUEUE``, in ``Keyspace.admission(model)``), lowered by a client's own
  ``max_queue``. A refusal carries the workers' retry hint.
- ``front``: a job taken over from a dead worker (or handed back by one shutting down)
  is pushed with RPUSH, so it is the next one a worker pops: its caller is waiting.

kombu has no hook for either, so its Redis channel's ``_put`` is wrapped once per process;
without a placement active on the calling thread the wrapper is kombu's own ``_put``.
Priorities would use other lists (``queue<sep>pri``); kvrelay sends none, so a job's list
is the queue's own.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from kvrelay.keys import Keyspace
from kvrelay.replica_wait import ReplicaWait
from kvrelay.sentinel_url import WAIT_REPLICAS_OPTION, WAIT_TIMEOUT_OPTION

__all__ = [
    "DEFAULT_RETRY_AFTER_S",
    "MAX_QUEUE_TIMEOUT_S",
    "AdmissionRefused",
    "admission_fields",
    "at_front",
    "publish_task",
]

# The longest queue wait a caller may ask for: shorter than the abort flag's lifetime
# (``ABORT_FLAG_TTL_S``, one hour), so a job whose caller gave up is still marked aborted
# whenever a worker could pick it up. Workers cap older payloads the same way.
MAX_QUEUE_TIMEOUT_S: Final = 3000.0
# Retry hint when no worker advertised one (a client-side ``max_queue`` refused).
DEFAULT_RETRY_AFTER_S: Final = 1.0

# KEYS: queue list, admission hash -- ARGV: message, client cap ('' = none)
# -> {1, new length} admitted | {0, length, cap, retry_after} refused
_ADMIT: Final = """
local cap = tonumber(redis.call('HGET', KEYS[2], 'max_queue'))
local mine = tonumber(ARGV[2])
if mine and (not cap or mine < cap) then cap = mine end
local length = redis.call('LLEN', KEYS[1])
if cap and length >= cap then
  return {0, length, cap, redis.call('HGET', KEYS[2], 'retry_after') or ''}
end
return {1, redis.call('LPUSH', KEYS[1], ARGV[1])}
"""


class AdmissionRefused(Exception):
    """The queue was full: nothing was pushed."""

    def __init__(self, length: int, cap: int, retry_after: float) -> None:
        super().__init__(f"the queue holds {length} jobs (limit {cap})")
        self.length = length
        self.cap = cap
        self.retry_after = retry_after


@dataclass(slots=True)
class _Placement:
    front: bool
    admission_key: str
    cap: int | None


_local = threading.local()
_install_lock = threading.Lock()


def admission_fields(max_queue: int, retry_after: float) -> dict[str, str]:
    """The admission hash a worker advertises (``max_queue`` <= 0: no server limit)."""
    fields = {"retry_after": repr(float(retry_after))}
    if max_queue > 0:
        fields["max_queue"] = str(int(max_queue))
    return fields


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
) -> None:
    """``app.send_task`` to ``model``'s queue with a placement (blocking; raises
    ``AdmissionRefused`` when an ``admit`` finds the queue full).

    ``max_queue`` is the caller's own limit ("refuse while more than this many wait");
    ``queue`` a worker's own Celery queue instead of the shared one (``kvrelay.placement``).
    """
    _install()
    cap = None if max_queue is None else max_queue + 1
    from kvrelay.enqueue import task_argsrepr  # enqueue imports this module

    placement = _Placement(front=False, admission_key=keys.admission(model), cap=cap)
    with _placed(placement):
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
    with _placed(_Placement(front=True, admission_key="", cap=None)):
        yield


@contextlib.contextmanager
def _placed(placement: _Placement) -> Iterator[None]:
    previous = getattr(_local, "placement", None)
    _local.placement = placement
    try:
        yield
    finally:
        _local.placement = previous


_replica_waits: dict[tuple[int, int], ReplicaWait] = {}


def _replica_wait(transport_options: dict[str, Any]) -> ReplicaWait:
    """The process's ``ReplicaWait`` for a broker's WAIT settings (sentinel mode; none
    elsewhere), shared by its connections: a missing replica is noticed once for all."""
    replicas = int(transport_options.get(WAIT_REPLICAS_OPTION, 0))
    timeout_ms = int(transport_options.get(WAIT_TIMEOUT_OPTION, 0))
    with _install_lock:
        return _replica_waits.setdefault((replicas, timeout_ms),
                                         ReplicaWait(replicas, timeout_ms))


def _install() -> None:
    """Wrap kombu's Redis ``Channel._put`` (once per process)."""
    from kombu.transport import redis as kombu_redis
    from kombu.utils.json import dumps

    channel_cls: Any = kombu_redis.Channel
    with _install_lock:
        if getattr(channel_cls, "_kvrelay_placement", False):
            return
        original = channel_cls._put

        def _put(channel: Any, queue: str, message: Any, **kwargs: Any) -> Any:
            placement: _Placement | None = getattr(_local, "placement", None)
            if placement is None or "_publish_batch" in kwargs:
                return original(channel, queue, message, **kwargs)
            key = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
            replica_wait = _replica_wait(channel.connection.client.transport_options)
            wanted = replica_wait.wanted()
            with channel.conn_or_acquire() as client:
                # One connection for the push and the WAIT that follows it (sentinel mode):
                # the job is taken as enqueued only once a replica holds it too.
                pipe = client.pipeline(transaction=False)
                if placement.front:
                    pipe.rpush(key, dumps(message))
                else:
                    cap = "" if placement.cap is None else str(placement.cap)
                    # kombu prefixes a namespace's list names (``global_keyprefix``) in the
                    # commands it knows, EVAL not among them: the script gets the full name.
                    queue_key = (getattr(channel, "global_keyprefix", "") or "") + key
                    pipe.eval(_ADMIT, 2, queue_key, placement.admission_key,
                              dumps(message), cap)
                if wanted > 0:
                    pipe.execute_command("WAIT", wanted, replica_wait.timeout_ms)
                replies = pipe.execute()
                if wanted > 0:
                    replica_wait.observe(replies[-1])
                result = replies[0]
            if placement.front:
                return None
            if int(result[0]) == 1:
                return None
            raise AdmissionRefused(int(result[1]), int(result[2]), _retry_after(result[3]))

        channel_cls._put = _put
        channel_cls._kvrelay_placement = True
