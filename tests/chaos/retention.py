"""The retention rule, checked on the keys themselves (docs/chaos.md, the README's
"Retention"): once every job ended and ``KVRELAY_LOG_TTL`` passed, nothing of those jobs
is left in Redis except their abort flags (which expire within an hour): no record, log,
lease, watcher count or requeue marker, no record of theirs in any worker's tail, and no
prompt anywhere (a queued or unacknowledged Celery message).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from kvrelay.event_log import TAIL_FIELD, tail_records
from kvrelay.job_lifecycle import ABORT_FLAG_TTL_S
from kvrelay.keys import Keyspace

KEYS = Keyspace()


def _values(client: redis.Redis, key: bytes) -> list[Any]:
    kind_reply: Any = client.type(key)
    kind = kind_reply.decode() if isinstance(kind_reply, bytes) else str(kind_reply)
    if kind == "string":
        return [client.get(key) or b""]
    if kind == "hash":
        return [v for pair in client.hgetall(key).items() for v in pair]
    if kind == "list":
        return list(client.lrange(key, 0, -1))
    if kind in ("set", "zset"):
        return list(client.smembers(key) if kind == "set" else client.zrange(key, 0, -1))
    return []


def retained(client: redis.Redis, job_ids: Iterable[str], prompts: Iterable[str]) -> list[str]:
    """What breaks the rule: one line per key."""
    ids = {job_id.encode() for job_id in job_ids}
    markers = [p.encode() for p in prompts]
    found: list[str] = []
    abort_head = KEYS.abort_flag("").encode()[:-2]  # "kvrelay:abort:"
    for key in client.scan_iter(count=500):
        name = key.decode(errors="replace")
        named = [job_id for job_id in ids if job_id in key]
        if named:
            ttl = client.ttl(key)
            if not (key.startswith(abort_head) and 0 < ttl <= ABORT_FLAG_TTL_S):
                found.append(f"{name} (ttl {ttl})")
            continue
        if client.type(key) == b"stream":
            entries: list[Any] = client.xrange(key) or []
            for _, fields in entries:
                blob = (fields or {}).get(TAIL_FIELD.encode())
                jobs = {job for job, *_ in tail_records(bytes(blob))} if blob else set()
                if jobs & {i.decode() for i in ids}:
                    found.append(f"{name} holds events of ended jobs (ttl {client.ttl(key)})")
                    break
            continue
        if any(m in v for v in _values(client, key) for m in markers):
            found.append(f"{name} holds a prompt (ttl {client.ttl(key)})")
    return found
