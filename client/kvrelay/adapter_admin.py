"""``client.adapters``: load, unload and list the LoRA adapters of live workers.

A load or unload is one ``AdapterMessage`` on the namespace's control channel: every
live worker it concerns applies it between two engine steps and reports the outcome in
its heartbeat (``WorkerInfo.adapter_results``, under the message's ``request_id``). The
call waits for those reports, so when it returns the workers it names serve the adapter
(or have dropped it). Only live workers hear it: a worker started later loads what its
``KVRELAY_LORA_MODULES`` says (docs/adapters.md).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kvrelay.adapter_wire import (
    MAX_ADAPTER_PATH_CHARS,
    AdapterMessage,
    AdapterResult,
    adapter_name_error,
)
from kvrelay.config_values import seconds
from kvrelay.connection import REDIS_ERRORS
from kvrelay.errors import ControlTimeout, InvalidRequest, UnknownModel
from kvrelay.patience import patiently
from kvrelay.protocol import WorkerInfo, encode_control

if TYPE_CHECKING:
    from kvrelay.job_lifecycle import JobLifecycle

__all__ = ["AdapterAdmin", "ServedAdapter"]

# How often the heartbeats are read while waiting for the workers' reports (they are
# rewritten every KVRELAY_LEASE_REFRESH, a second by default).
_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    """An adapter as the live workers of its base model hold it."""

    name: str
    base: str
    # Where the workers loaded it from (each worker's own path; the first one's here).
    path: str
    workers: tuple[str, ...]


class AdapterAdmin:
    """The adapter operations of one client (its namespace's workers only)."""

    def __init__(self, jobs: JobLifecycle, default_model: str | None) -> None:
        self._jobs = jobs
        self._default_model = default_model

    async def list(self, model: str | None = None) -> list[ServedAdapter]:
        """Every adapter some live worker holds (of ``model`` only, when given)."""
        found: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for worker in await self._jobs.workers():
            if model is not None and worker.model != model:
                continue
            for adapter in worker.adapters:
                found.setdefault((adapter.base or worker.model, adapter.name), []).append(
                    (worker.worker_id, adapter.path))
        return [ServedAdapter(name=name, base=base, path=held[0][1],
                              workers=tuple(sorted(w for w, _ in held)))
                for (base, name), held in sorted(found.items())]

    async def load(self, name: str, path: str, *, model: str | None = None,
                   timeout: float = 120.0,  # noqa: ASYNC109 - how long workers may take
                   ) -> dict[str, AdapterResult]:
        """Load adapter ``name`` from ``path`` (a PEFT folder on the workers' machines) on
        every live worker of ``model``; returns each worker's report, by worker id.

        Raises ``InvalidRequest`` when a worker could not load it (the message says
        which and why), ``UnknownModel`` when no live worker serves ``model`` and
        ``ControlTimeout`` when a worker did not report within ``timeout`` seconds.
        """
        _check_name(name)
        if not isinstance(path, str) or not path or len(path) > MAX_ADAPTER_PATH_CHARS:
            raise InvalidRequest(f"path must be a non-empty str of at most "
                                 f"{MAX_ADAPTER_PATH_CHARS} characters")
        target = model or self._default_model
        if not isinstance(target, str) or not target:
            raise InvalidRequest("no model: pass model=... to the client or to this call")
        workers = [w.worker_id for w in await self._jobs.workers() if w.model == target]
        if not workers:
            raise UnknownModel(f"no live worker serves model {target!r}: none to load "
                               f"adapter {name!r} on")
        message = AdapterMessage(action="load", name=name, path=path, model=target,
                                 request_id=uuid.uuid4().hex)
        return await self._apply(message, workers, seconds("timeout", timeout))

    async def unload(self, name: str, *, model: str | None = None,
                     timeout: float = 120.0,  # noqa: ASYNC109 - as load's
                     ) -> dict[str, AdapterResult]:
        """Unload adapter ``name`` from every live worker that holds it (of ``model`` only,
        when given); returns each worker's report. A worker lets the adapter's running
        jobs finish and takes no new ones. Raises ``InvalidRequest`` when no live worker
        holds it, ``ControlTimeout`` as ``load`` does."""
        _check_name(name)
        workers = [w.worker_id for w in await self._jobs.workers()
                   if (model is None or w.model == model)
                   and any(a.name == name for a in w.adapters)]
        if not workers:
            where = f" of model {model!r}" if model else ""
            raise InvalidRequest(f"no live worker{where} holds adapter {name!r}")
        message = AdapterMessage(action="unload", name=name, model=model,
                                 request_id=uuid.uuid4().hex)
        return await self._apply(message, workers, seconds("timeout", timeout))

    async def _apply(self, message: AdapterMessage, workers: Collection[str],
                     within: float) -> dict[str, AdapterResult]:
        """Publish ``message``, then wait for the report of each of ``workers`` (one that
        dies meanwhile is left out); a failed report raises ``InvalidRequest``."""
        redis, keys = self._jobs.redis, self._jobs.keys
        try:
            await patiently(lambda: redis.publish(keys.control_channel,
                                                  encode_control(message)),
                            self._jobs.reconnect_timeout)
        except REDIS_ERRORS as exc:
            raise self._jobs.connection_error(exc, f"sending the {message.action} of "
                                                   f"adapter {message.name}") from exc
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + within
        waiting = set(workers)
        reports: dict[str, AdapterResult] = {}
        while True:
            live = {w.worker_id: w for w in await self._jobs.workers()}
            waiting &= set(live)
            for worker_id in list(waiting):
                report = _report(live[worker_id], message.request_id)
                if report is not None:
                    reports[worker_id] = report
                    waiting.discard(worker_id)
            if not waiting:
                break
            if loop.time() >= give_up_at:
                raise ControlTimeout(
                    f"{len(waiting)} worker(s) did not report the {message.action} of adapter "
                    f"{message.name!r} within {within:g}s: {', '.join(sorted(waiting))}")
            await asyncio.sleep(_POLL_S)
        _raise_failures(message.action, message.name, reports)
        return reports


def _check_name(name: object) -> None:
    problem = adapter_name_error(name)
    if problem is not None:
        raise InvalidRequest(f"name: {problem}")


def _report(worker: WorkerInfo, request_id: str) -> AdapterResult | None:
    return next((r for r in worker.adapter_results if r.request_id == request_id), None)


def _raise_failures(action: Literal["load", "unload"], name: str,
                    reports: dict[str, AdapterResult]) -> None:
    failed = {worker: r for worker, r in reports.items() if not r.ok}
    if not failed:
        return
    done = len(reports) - len(failed)
    why = "; ".join(f"{worker}: {r.message}" for worker, r in sorted(failed.items()))
    raise InvalidRequest(f"could not {action} adapter {name!r} on {len(failed)} of "
                         f"{len(reports)} worker(s) ({done} did): {why}")
