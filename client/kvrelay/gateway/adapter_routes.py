"""LoRA adapters at the gateway: a ``model`` that names an adapter, ``/v1/models`` listing
each adapter with its ``parent``, and the admin routes that load, unload and list them.

An adapter's jobs go to its base model's queue with ``lora=<name>`` (the SDK's keyword).
Which names are adapters comes from the workers' heartbeats, read at most once a second
per namespace (and once more when a name is unknown: an adapter loaded a moment ago).
The admin routes act through the SDK's ``client.adapters`` and need the admin key
(``KVRELAY_GATEWAY_ADMIN_KEY``): without one configured they are off (403).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvrelay.adapter_wire import AdapterResult
from kvrelay.client import AsyncClient
from kvrelay.errors import ControlTimeout, KvrelayError
from kvrelay.gateway.body import read_body
from kvrelay.gateway.errors import GatewayError, bad_request, from_kvrelay
from kvrelay.gateway.settings import GatewaySettings
from kvrelay.protocol import WorkerInfo

# How long one read of the registry answers "which names are adapters".
_FRESH_S = 1.0
# How soon an unknown name may read the registry again.
_RECHECK_S = 0.1


def model_list(workers: list[WorkerInfo]) -> list[dict[str, Any]]:
    """``/v1/models``' data: each served model, then each adapter with its ``parent``."""
    created: dict[str, int] = {}
    adapters: dict[str, tuple[str, int]] = {}
    for worker in workers:
        created.setdefault(worker.model, int(worker.started_at))
        for adapter in worker.adapters:
            adapters.setdefault(adapter.name, (adapter.base or worker.model,
                                               int(adapter.loaded_at)))
    data: list[dict[str, Any]] = [
        {"id": name, "object": "model", "created": created[name], "owned_by": "kvrelay"}
        for name in sorted(created)]
    data += [{"id": name, "object": "model", "created": loaded, "owned_by": "kvrelay",
              "parent": base} for name, (base, loaded) in sorted(adapters.items())
             if name not in created]
    return data


class _Names:
    """One namespace's served models and adapters (adapter -> base), as last read."""

    def __init__(self) -> None:
        self.read_at = -1e9
        self.models: frozenset[str] = frozenset()
        self.adapters: dict[str, str] = {}


class ModelRouter:
    """Maps a request's ``model`` to (the model to enqueue for, the adapter or None)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._names: dict[str, _Names] = {}

    async def route(self, client: AsyncClient, namespace: str, model: str) -> tuple[str, str | None]:
        """A served model name is itself; an adapter's is its base's, with the adapter. A
        name that is neither goes on as a model (the SDK answers it as unknown)."""
        names = self._names.setdefault(namespace, _Names())
        age = self._clock() - names.read_at
        if age >= _FRESH_S or (age >= _RECHECK_S and model not in names.models
                               and model not in names.adapters):
            self._update(names, await client.workers())
        if model in names.models or model not in names.adapters:
            return model, None
        return names.adapters[model], model

    def _update(self, names: _Names, workers: list[WorkerInfo]) -> None:
        names.read_at = self._clock()
        names.models = frozenset(w.model for w in workers)
        names.adapters = {a.name: a.base or w.model for w in workers for a in w.adapters}


class LoadBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/admin/adapters``: load adapter ``name`` of ``model`` from ``path``."""

    name: str
    path: str
    model: str
    namespace: str | None = None
    timeout: float | None = None


class AdapterAdminRoutes:
    """``GET``/``POST /v1/admin/adapters`` and ``DELETE /v1/admin/adapters/{name}``."""

    def __init__(self, clients: Mapping[str, AsyncClient], settings: GatewaySettings,
                 answer: Callable[[str, Response], Response],
                 refuse: Callable[[str, GatewayError], Response]) -> None:
        self.clients = clients
        self.settings = settings
        self._key = _digest(settings.admin_key) if settings.admin_key else None
        self._answer = answer
        self._refuse = refuse

    async def list(self, request: Request) -> Response:
        try:
            self._check_key(request)
            client = self._client(request.query_params.get("namespace"))
            served = await client.adapters.list(request.query_params.get("model"))
        except GatewayError as exc:
            return self._refuse("admin_adapters", exc)
        except KvrelayError as exc:
            return self._refuse("admin_adapters", _http_error(exc, self.settings))
        data = [{"id": a.name, "object": "model", "parent": a.base, "path": a.path,
                 "workers": list(a.workers)} for a in served]
        return self._answer("admin_adapters", JSONResponse({"object": "list", "data": data}))

    async def load(self, request: Request) -> Response:
        try:
            self._check_key(request)
            body = _decode(await read_body(request, self.settings.limits))
            client = self._client(body.namespace)
            wait = 120.0 if body.timeout is None else body.timeout
            reports = await client.adapters.load(body.name, body.path, model=body.model,
                                                 timeout=wait)
        except GatewayError as exc:
            return self._refuse("admin_adapters", exc)
        except KvrelayError as exc:
            return self._refuse("admin_adapters", _http_error(exc, self.settings))
        return self._answer("admin_adapters", JSONResponse(
            {"id": body.name, "parent": body.model, "loaded": True, **_workers(reports)}))

    async def unload(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            self._check_key(request)
            client = self._client(request.query_params.get("namespace"))
            reports = await client.adapters.unload(name, model=request.query_params.get("model"))
        except GatewayError as exc:
            return self._refuse("admin_adapters", exc)
        except KvrelayError as exc:
            return self._refuse("admin_adapters", _http_error(exc, self.settings))
        return self._answer("admin_adapters", JSONResponse(
            {"id": name, "unloaded": True, **_workers(reports)}))

    def _check_key(self, request: Request) -> None:
        if self._key is None:
            raise GatewayError(403, "the admin routes are off: set KVRELAY_GATEWAY_ADMIN_KEY",
                               kind="permission_error", code="admin_disabled")
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(_digest(key.strip()),
                                                                 self._key):
            raise GatewayError(401, "the admin routes need the admin key: "
                               "'Authorization: Bearer <KVRELAY_GATEWAY_ADMIN_KEY>'",
                               kind="authentication_error", code="invalid_api_key")

    def _client(self, namespace: str | None) -> AsyncClient:
        chosen = self.settings.namespace if namespace is None else namespace
        client = self.clients.get(chosen)
        if client is None:
            raise bad_request(f"namespace: this gateway serves {sorted(self.clients)}, "
                              f"not {chosen!r}", "namespace")
        return client


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _decode(raw: bytes) -> LoadBody:
    """The load body; a malformed one is a 400 naming the field."""
    try:
        return msgspec.json.decode(raw, type=LoadBody)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at ")
        if message:
            param = where.strip("`").removeprefix("$.")
            raise bad_request(f"{param}: {message}", param) from None
        field = re.search(r"field `(\w+)`", str(exc))  # missing, or unknown
        raise bad_request(str(exc), field.group(1) if field else None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None


def _http_error(exc: KvrelayError, settings: GatewaySettings) -> GatewayError:
    if isinstance(exc, ControlTimeout):
        return GatewayError(504, str(exc), kind="timeout", code=exc.code)
    return from_kvrelay(exc, retry_after=settings.retry_after)


def _workers(reports: dict[str, AdapterResult]) -> dict[str, Any]:
    return {"workers": sorted(reports),
            "messages": {worker: r.message for worker, r in sorted(reports.items())}}
