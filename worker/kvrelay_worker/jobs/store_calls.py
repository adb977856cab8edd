"""How the job store sends its script calls: pipelined, by function name, loaded again
when Redis lost them, and behind sentinels closed by a ``WAIT`` (``StoreCalls``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import redis

from kvrelay.event_log import AppendResult
from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import Functions, LuaScript, is_missing
from kvrelay.replica_wait import ReplicaWait
from kvrelay_worker.redis_client import replica_wait
from kvrelay_worker.settings import WorkerSettings

# A script, its keys and its arguments.
ScriptCall = tuple[LuaScript, list[str], list[Any]]
# A pub/sub message and its channel.
Message = tuple[str, bytes]


def now_ms() -> int:
    return int(time.time() * 1000)


def run_id(worker_id: str) -> str:
    """A new run id for one claim by ``worker_id``: what its lease holds."""
    return f"{worker_id}#{secrets.token_hex(6)}"


def written(result: object) -> bool:
    """An append's answer that says its event is in the log (now, or by an earlier try
    whose reply was lost)."""
    return isinstance(result, int) and (result >= 0 or result == AppendResult.ALREADY_WRITTEN)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StoreCalls:
    """One worker's Redis connection pool, its names, and the way its calls go out."""

    def __init__(self, client: redis.Redis, settings: WorkerSettings, *,
                 functions: bool | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.worker_id = settings.worker_id
        self.keys = settings.keys
        self.running_key = self.keys.running_jobs(settings.served_model)
        self.fresh_key = self.keys.fresh_jobs(settings.served_model)
        # The scripts, as Redis Functions (``functions``: whether the server has them;
        # None: ask it); a worker loads them where they are missing.
        self.scripts = Functions(client, LIBRARY, namespace=self.keys.namespace,
                                 functions=functions)
        self.tail_key = self.keys.worker_tail(self.worker_id)
        # The tail's name less a worker id: the scripts name a previous owner's tail.
        self.tail_prefix = self.keys.worker_tail("")
        # Raised by another worker's claim of one of this worker's jobs, and by any ending
        # of one of them that is not its run's own; and its prefix, with which a script
        # names another worker's.
        self.fence_key = self.keys.worker_fenced(self.worker_id)
        self.fence_prefix = self.keys.worker_fenced("")
        # Behind sentinels: replicas that must hold a job-state write before it counts.
        self._replica_wait = ReplicaWait(*replica_wait(settings))

    @property
    def lease_ms(self) -> int:
        return int(self.settings.lease_ttl * 1000)

    @property
    def ended_ttl_s(self) -> int:
        """How long an ended job's record stays: as long as its log, no longer."""
        return max(1, int(self.settings.log_ttl))

    @property
    def live_ttl_s(self) -> int:
        """How long a running job's log and record outlive its latest write."""
        return max(1, int(self.settings.log_live_ttl))

    def shorten_tail(self, ttl_s: int) -> None:
        """This worker's tail expires within ``ttl_s`` (never later than it did)."""
        self.redis.expire(self.tail_key, ttl_s, lt=True)

    def _pipelined(self, calls: list[ScriptCall]) -> list[Any]:
        """Run script calls in one pipelined round trip, by name (``FCALL``; ``EVALSHA``
        without functions) alone.

        A script missing from the server (Redis restarted without persistence, or
        ``FUNCTION FLUSH``) fails with an error reply; the library is loaded again and
        only those calls are sent again (a user that may not load: ``FunctionsMissing``).
        """
        results = self._send_calls(calls)
        missing = [i for i, r in enumerate(results) if is_missing(r)]
        if missing:
            self.scripts.load()
            for i, result in zip(missing, self._send_calls([calls[i] for i in missing]),
                                 strict=True):
                results[i] = result
        return results

    def _one(self, script: LuaScript, key_list: list[str], args: list[Any]) -> Any:
        """One script call through ``_pipelined`` (so it gets the replica WAIT too)."""
        result = self._pipelined([(script, key_list, args)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def _send_calls(self, calls: list[ScriptCall]) -> list[Any]:
        """The calls in one round trip; behind sentinels a ``WAIT`` closes it, so they
        count as written only once a replica holds them (a failover cannot lose them;
        a connection lost before the reply makes the caller send them again)."""
        pipe = self.redis.pipeline(transaction=False)
        for script, key_list, args in calls:
            self.scripts.queue(pipe, script, key_list, args)
        return self._execute(pipe)

    def _defer_publish(self) -> bool:
        """Whether the next write's events are published only after its ``WAIT``: behind
        sentinels a client never sees an event that a failover could still lose (at a
        takeover the next run would write another event under its seq)."""
        return self._replica_wait.wanted(self.redis.connection_pool) > 0

    def _publish(self, messages: Sequence[Message]) -> None:
        """Publish what a deferred write left out, in one round trip (a lost connection
        raises: the write is sent again, and readers drop the seqs they already have)."""
        if not messages:
            return
        pipe = self.redis.pipeline(transaction=False)
        for channel, message in messages:
            pipe.publish(channel, message)
        pipe.execute()

    def _execute(self, pipe: Any) -> list[Any]:
        """Send a pipeline of writes; behind sentinels closed by a ``WAIT`` (its reply
        left out) and judged by the server that carried them. Error replies come back
        in place."""
        return self._replica_wait.execute(pipe, raise_on_error=False)
