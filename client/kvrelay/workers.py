"""Reading the worker registry: who is alive, which models are served.

Workers ``SADD`` their id to ``Keyspace.workers`` and keep ``Keyspace.worker_heartbeat(id)``
alive with a short expiry. An id whose heartbeat key is gone is a dead worker; readers
remove it from the set so the set does not grow with every crashed process.
"""

from __future__ import annotations

import logging

import msgspec
from redis.asyncio import Redis

from kvrelay.keys import Keyspace
from kvrelay.protocol import WorkerInfo, decode_worker_info

__all__ = ["live_workers", "missing_adapter", "payload_limits", "served_adapters", "served_models"]

log = logging.getLogger("kvrelay.workers")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def live_workers(redis: Redis, keys: Keyspace, *, prune: bool = True) -> list[WorkerInfo]:
    """Every worker with a live heartbeat, sorted by id; dead ids are pruned if ``prune``."""
    ids = sorted(_text(member) for member in await redis.smembers(keys.workers))
    if not ids:
        return []
    values = await redis.mget([keys.worker_heartbeat(worker_id) for worker_id in ids])
    live: list[WorkerInfo] = []
    dead: list[str] = []
    for worker_id, raw in zip(ids, values, strict=True):
        if raw is None:
            dead.append(worker_id)
            continue
        try:
            live.append(decode_worker_info(raw))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Alive but unreadable (maybe a newer worker): not ours to prune.
            log.warning("unreadable heartbeat of worker %s: %s", worker_id, exc)
    if prune and dead:
        await redis.srem(keys.workers, *dead)
    return live


def served_models(workers: list[WorkerInfo]) -> frozenset[str]:
    """The models at least one of ``workers`` serves."""
    return frozenset(worker.model for worker in workers)


def payload_limits(workers: list[WorkerInfo]) -> dict[str, int]:
    """Per model, the smallest payload limit its workers advertise (0: not advertised)."""
    limits: dict[str, int] = {}
    for worker in workers:
        if worker.max_payload_bytes > 0:
            limits[worker.model] = min(limits.get(worker.model, worker.max_payload_bytes),
                                       worker.max_payload_bytes)
    return limits


def served_adapters(workers: list[WorkerInfo]) -> dict[str, frozenset[str]]:
    """Per model, the LoRA adapters at least one of its live workers holds."""
    held: dict[str, set[str]] = {}
    for worker in workers:
        held.setdefault(worker.model, set()).update(a.name for a in worker.adapters)
    return {model: frozenset(names) for model, names in held.items()}


def missing_adapter(adapters: dict[str, frozenset[str]], model: str, lora: str) -> str | None:
    """Why a job of ``model`` with adapter ``lora`` would find no worker to run it (None:
    some live worker holds it)."""
    held = adapters.get(model, frozenset())
    if lora in held:
        return None
    listing = ", ".join(sorted(held)) if held else "none"
    return (f"lora: no live worker of model {model!r} holds adapter {lora!r} (its adapters: "
            f"{listing}); load it with `kvrelay adapters load` or KVRELAY_LORA_MODULES")
