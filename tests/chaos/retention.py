"""The retention rule, checked on the keys themselves (docs/chaos.md, the README's
"Retention"): once every job ended and ``KVRELAY_LOG_TTL`` passed, nothing of those jobs
is left in Redis except their abort flags and end marks (which expire within an hour): no record, log,
lease, watcher count or requeue marker, no record of theirs in any worker's tail, and no
prompt or job id in any value: every list of queued messages and kombu's ``unacked``
hash are read with each message body decoded (kombu stores bodies base64-encoded). Each
key is judged from its last write (``retained_past_last_write``).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from kvrelay.event_log import TAIL_FIELD, tail_records
from kvrelay.job_lifecycle import ABORT_FLAG_TTL_S
from kvrelay.job_script_helpers import END_MARK_TTL_S
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


def _kombu_bodies(value: bytes) -> list[bytes]:
    """The decoded bodies of the kombu messages ``value`` holds: a message as queued
    (a JSON object with ``body`` and ``properties.body_encoding``) or as kept in the
    ``unacked`` hash (a JSON list whose first item is the message). kombu stores a body
    base64-encoded, so a prompt or job id inside it never shows in the raw value."""
    try:
        loaded = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return []
    messages = [loaded] if isinstance(loaded, dict) else [
        m for m in loaded if isinstance(m, dict)] if isinstance(loaded, list) else []
    bodies = []
    for message in messages:
        body = message.get("body")
        properties = message.get("properties")
        if not isinstance(body, str) or not isinstance(properties, dict):
            continue
        if properties.get("body_encoding") == "base64":
            try:
                bodies.append(base64.b64decode(body, validate=False))
            except (binascii.Error, ValueError):
                bodies.append(body.encode())
        else:
            bodies.append(body.encode())
    return bodies


def _readable(values: list[Any]) -> list[bytes]:
    """Each value as stored, and beside it the decoded body of any kombu message in it."""
    out: list[bytes] = []
    for value in values:
        raw = value if isinstance(value, bytes) else str(value).encode()
        out.append(raw)
        out += _kombu_bodies(raw)
    return out


def retained(client: redis.Redis, job_ids: Iterable[str], prompts: Iterable[str]) -> list[str]:
    """What breaks the rule: one line per key."""
    return [line for line, _ in _retained(client, job_ids, prompts)]


def retained_past_last_write(client: redis.Redis, job_ids: Iterable[str],
                             prompts: Iterable[str], ttl_s: float,
                             sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """``retained``, judged from each key's last write: a key of an ended job still there
    with at most ``ttl_s`` to live was written again late (a write sent again after a
    failover or refused writes lands after the caller saw the end) and is looked at once
    more after it should have expired; what is left then, and every key without such an
    expiry, breaks the rule."""
    first = _retained(client, job_ids, prompts)
    expiring = [ttl for _, ttl in first if 0 <= ttl <= ttl_s]
    if not expiring:
        return [line for line, _ in first]
    sleep(max(expiring) + 1.0)
    return retained(client, job_ids, prompts)


def _retained(client: redis.Redis, job_ids: Iterable[str], prompts: Iterable[str]
              ) -> list[tuple[str, int]]:
    ids = {job_id.encode() for job_id in job_ids}
    markers = [p.encode() for p in prompts]
    found: list[tuple[str, int]] = []
    # What an ended job may leave for an hour: its abort flag and its end mark.
    hour_heads = (KEYS.abort_flag("").encode()[:-2], KEYS.end_mark("").encode()[:-2])
    hour_s = max(ABORT_FLAG_TTL_S, END_MARK_TTL_S)
    for key in client.scan_iter(count=500):
        name = key.decode(errors="replace")
        named = [job_id for job_id in ids if job_id in key]
        ttl = int(client.ttl(key))
        if named:
            if not (key.startswith(hour_heads) and 0 < ttl <= hour_s):
                found.append((f"{name} (ttl {ttl})", ttl))
            continue
        if client.type(key) == b"stream":
            entries: list[Any] = client.xrange(key) or []
            for _, fields in entries:
                blob = (fields or {}).get(TAIL_FIELD.encode())
                jobs = {job for job, *_ in tail_records(bytes(blob))} if blob else set()
                if jobs & {i.decode() for i in ids}:
                    found.append((f"{name} holds events of ended jobs (ttl {ttl})", ttl))
                    break
            continue
        values = _readable(_values(client, key))
        if any(m in v for v in values for m in markers):
            found.append((f"{name} holds a prompt (ttl {ttl})", ttl))
        elif any(i in v for v in values for i in ids):
            found.append((f"{name} holds the id of an ended job (ttl {ttl})", ttl))
    return found
