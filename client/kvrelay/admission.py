"""Where a Celery message lands in a model's queue: admitted under a limit, or at the front.

kombu's Redis transport pushes with LPUSH and consumers pop with BRPOP, so the right end
of the list is the one workers take next. Two placements, each one Redis call:

- ``admit``: a new job is pushed (LPUSH, the back) only while the model's backlog (its
  shared queue and every worker queue of it) holds fewer jobs than its limit, and its
  tenant is within its quota when it has one, checked, counted and pushed in one Lua
  script, so clients racing each other can never overfill it. The limit is what the model's workers advertise
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
from kvrelay.tenant_quota import TenantQuota, retry_after_for_rate

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

# The backlog a model's cap bounds is every job waiting for it: its shared queue and the
# queue of each worker of it that has one (``Keyspace.worker_queues``; a dead worker's
# counts until live workers move it to the shared queue), the target list included, and
# the jobs whose worker's lease on them has expired (``Keyspace.running_jobs`` scored
# below now): live workers will push those back onto the queue without asking, so their
# places are held for them. The
# tenant part (a job id given) checks and counts its quota (``kvrelay.tenant_quota``),
# with only the commands a tenant's ACL user may send (``kvrelay.acl``): the counted
# sets hold at most a limit's worth of live entries, so reading them whole is cheap.
# KEYS: target list, admission hash, shared queue, worker-queues set, tenant jobs, tenant
#   queued, tenant rate (these three any names without a quota), running-jobs set
# ARGV: message, client cap ('' = none), worker queue name prefix, job id ('' = no
#   quota), counted until (unix s), max jobs, max queued, rate, burst ('' = no limit)
# -> {1, length} admitted | {0, backlog, cap, retry} full | {2, jobs, limit, retry} |
#    {3, queued, limit, retry} tenant over a limit | {4, 0, 0, wait s} tenant's rate
_ADMIT: Final = """
local cap = tonumber(redis.call('HGET', KEYS[2], 'max_queue'))
local mine = tonumber(ARGV[2])
if mine and (not cap or mine < cap) then cap = mine end
local retry = redis.call('HGET', KEYS[2], 'retry_after') or ''
if cap then
  local seen = {[KEYS[3]] = true}
  local backlog = redis.call('LLEN', KEYS[3])
  for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
    local name = ARGV[3] .. id
    if not seen[name] then
      seen[name] = true
      backlog = backlog + redis.call('LLEN', name)
    end
  end
  if not seen[KEYS[1]] then backlog = backlog + redis.call('LLEN', KEYS[1]) end
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  backlog = backlog + #redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', '(' .. now_ms)
  if backlog >= cap then return {0, backlog, cap, retry} end
end
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local counts = {}
  for k = 5, 6 do
    for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[k], '-inf', now)) do
      redis.call('ZREM', KEYS[k], gone)
    end
    counts[k] = #redis.call('ZRANGE', KEYS[k], 0, -1)
  end
  local max_jobs = tonumber(ARGV[6])
  if max_jobs and counts[5] >= max_jobs then return {2, counts[5], max_jobs, retry} end
  local max_queued = tonumber(ARGV[7])
  if max_queued and counts[6] >= max_queued then return {3, counts[6], max_queued, retry} end
  local rate = tonumber(ARGV[8])
  if rate then
    local burst = tonumber(ARGV[9])
    local state = redis.call('HMGET', KEYS[7], 'tokens', 'at')
    local tokens = tonumber(state[1]) or burst
    local at = tonumber(state[2]) or now
    tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
    if tokens < 1 then return {4, 0, 0, tostring((1 - tokens) / rate)} end
    redis.call('HSET', KEYS[7], 'tokens', tostring(tokens - 1), 'at', tostring(now))
    redis.call('EXPIRE', KEYS[7], math.ceil(burst / rate) + 1)
  end
  local counted_until = tonumber(ARGV[5])
  local ttl = math.ceil(counted_until - now) + 1
  for k = 5, 6 do
    redis.call('ZADD', KEYS[k], counted_until, ARGV[4])
    if redis.call('PTTL', KEYS[k]) < ttl * 1000 then redis.call('EXPIRE', KEYS[k], ttl) end
  end
end
return {1, redis.call('LPUSH', KEYS[1], ARGV[1])}
"""

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


@dataclass(slots=True)
class _Placement:
    front: bool
    admission_key: str
    cap: int | None
    # The model's shared queue, its worker-queues set and its worker queues' name prefix.
    backlog: tuple[str, str, str] = ("", "", "")
    model: str = ""
    job_id: str = ""
    quota: TenantQuota | None = None
    counted_until: float = 0.0
    tenant_keys: tuple[str, str, str] = ("", "", "")
    running: str = ""


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
    quota: TenantQuota | None = None,
    counted_until: float = 0.0,
) -> None:
    """``app.send_task`` to ``model``'s queue with a placement (blocking; raises
    ``AdmissionRefused`` when an ``admit`` finds the backlog full or the tenant over
    ``quota``, whose counts of this job last until ``counted_until``, unix s).

    ``max_queue`` is the caller's own limit ("refuse while more than this many wait");
    ``queue`` a worker's own Celery queue instead of the shared one (``kvrelay.placement``).
    """
    _install()
    cap = None if max_queue is None else max_queue + 1
    from kvrelay.enqueue import task_argsrepr  # enqueue imports this module

    tenant = quota.tenant if quota is not None else ""
    placement = _Placement(
        front=False, admission_key=keys.admission(model), cap=cap,
        backlog=(keys.queue(model), keys.worker_queues(model), keys.worker_queue(model, "")),
        model=model, job_id=task_id, quota=quota, counted_until=counted_until,
        tenant_keys=(keys.tenant_jobs(tenant), keys.tenant_queued(tenant),
                     keys.tenant_rate(tenant)),
        running=keys.running_jobs(model))
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
                    quota = placement.quota
                    shared, registry, worker_prefix = placement.backlog
                    pipe.eval(_ADMIT, 8, queue_key, placement.admission_key, shared, registry,
                              *placement.tenant_keys, placement.running, dumps(message), cap,
                              worker_prefix,
                              placement.job_id if quota is not None else "",
                              repr(placement.counted_until),
                              *(quota.script_args() if quota is not None else ["", "", "", "1"]))
                if wanted > 0:
                    pipe.execute_command("WAIT", wanted, replica_wait.timeout_ms)
                replies = pipe.execute()
                if wanted > 0:
                    replica_wait.observe(replies[-1])
                result = replies[0]
            if placement.front:
                return None
            code = int(result[0])
            if code == 1:
                return None
            quota = placement.quota
            reason = _REFUSALS.get(code, _REFUSALS[0]).format(
                model=placement.model, count=int(result[1]), limit=int(result[2]),
                tenant=quota.tenant if quota else "",
                rate=(quota.requests_per_second or 0.0) if quota else 0.0)
            if code == 4:
                raise AdmissionRefused(reason, retry_after_for_rate(float(result[3])))
            raise AdmissionRefused(reason, _retry_after(result[3]))

        channel_cls._put = _put
        channel_cls._kvrelay_placement = True
