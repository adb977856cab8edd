"""The LoRA adapters a worker serves, and the one place that changes them.

Adapters come from ``KVRELAY_LORA_MODULES`` at start and from ``AdapterMessage``s on the
control channel at run time. Every change runs on the engine thread, between two steps
(``EngineService.call``), as ``LLMEngine.add_lora`` / ``remove_lora`` require. The engine
owns the adapters' weights and lets the jobs that already run with an adapter finish
with it when it is unloaded or replaced; this keeps what the worker tells the world: the
names jobs may use (``refusal``), and for the heartbeat thread the adapters held and the
latest outcomes (``advertised``, ``results``: copies swapped under a lock).

Paths only: the worker's loading package has no Hugging Face name resolver, so an
adapter is a local PEFT folder (``adapter_config.json`` beside its weights).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrelay.adapter_wire import (
    MAX_ADAPTER_RESULTS,
    AdapterInfo,
    AdapterMessage,
    AdapterResult,
    adapter_name_error,
)

log = logging.getLogger(__name__)

ADAPTER_CONFIG_FILE = "adapter_config.json"
# How much of a failure's text a heartbeat carries (its results are kept, 16 of them).
_MAX_MESSAGE_CHARS = 500


class AdapterSettingError(ValueError):
    """``KVRELAY_LORA_MODULES`` is malformed."""


def parse_lora_modules(text: str) -> list[tuple[str, str]]:
    """``"name=path,name2=path2"`` -> ``[(name, path), ...]``; names valid and distinct."""
    modules: list[tuple[str, str]] = []
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise AdapterSettingError(f"KVRELAY_LORA_MODULES: expected 'name=path', got {entry!r}")
        problem = adapter_name_error(name)
        if problem is not None:
            raise AdapterSettingError(f"KVRELAY_LORA_MODULES: {problem}")
        if any(name == seen for seen, _ in modules):
            raise AdapterSettingError(f"KVRELAY_LORA_MODULES names adapter {name!r} twice")
        modules.append((name, path))
    return modules


# What a PEFT LoRA repository holds that the engine reads (never pickled weights).
ADAPTER_FILES = [ADAPTER_CONFIG_FILE, "adapter_model.safetensors"]


def adapter_folder(path: str) -> Path:
    """The PEFT folder ``path`` names, resolved; ``ValueError`` saying what is wrong.

    A local folder wins; otherwise ``org/name[@revision]`` is fetched into the shared
    Hugging Face cache through the same resolution as models (``HF_TOKEN``,
    ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``), its adapter files only.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        from kvrelay_worker.loading import fetch_repo, parse_hub_name

        hub = parse_hub_name(path)
        if hub is None or hub.quant is not None:
            raise ValueError(f"no adapter folder at {path} (a local PEFT folder with "
                             f"{ADAPTER_CONFIG_FILE}, or a Hugging Face repository "
                             "org/name[@revision])")
        folder = fetch_repo(hub, ADAPTER_FILES, progress=False)
    if not (folder / ADAPTER_CONFIG_FILE).is_file():
        raise ValueError(f"{path} has no {ADAPTER_CONFIG_FILE}: not a PEFT adapter folder")
    return folder.resolve()


@dataclass
class _Held:
    path: str
    loaded_at: float


class ServedAdapters:
    """The worker's adapters of ``base`` (its served model name)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._held: dict[str, _Held] = {}  # engine thread only
        self._lock = threading.Lock()
        self._advertised: list[AdapterInfo] = []
        self._results: deque[AdapterResult] = deque(maxlen=MAX_ADAPTER_RESULTS)

    # ------------------------------------------------------------ any thread

    def advertised(self) -> list[AdapterInfo]:
        """The adapters jobs may name now (for the heartbeat)."""
        with self._lock:
            return list(self._advertised)

    def results(self) -> list[AdapterResult]:
        """The latest load/unload outcomes, oldest first (for the heartbeat)."""
        with self._lock:
            return list(self._results)

    # ---------------------------------------------------------- engine thread

    def refusal(self, name: str) -> str | None:
        """Why a job may not run with adapter ``name`` here (None: it may)."""
        if name in self._held:
            return None
        listing = ", ".join(sorted(self._held)) or "none"
        return f"this worker of {self.base!r} holds no adapter {name!r} (it holds: {listing})"

    def load_at_start(self, engine: Any, modules: list[tuple[str, str]]) -> None:
        """Load ``KVRELAY_LORA_MODULES``; the first failure stops the worker's start."""
        for name, path in modules:
            try:
                self._load(engine, name, path)
            except Exception as exc:
                raise AdapterSettingError(
                    f"KVRELAY_LORA_MODULES: could not load adapter {name!r}: {exc}") from exc
        self._publish()

    def apply(self, engine: Any, message: AdapterMessage) -> None:
        """Carry out one control message and record its outcome (never raises)."""
        if message.action == "unload" and message.model is None and message.name not in self._held:
            return  # broadcast to every worker of every model: only those holding it answer
        try:
            if message.action == "load":
                text = self._load(engine, message.name, message.path or "")
            else:
                text = self._unload(engine, message.name)
            ok = True
        except Exception as exc:  # a bad folder, LoRA off, ...: reported, never raised
            text, ok = (str(exc) or type(exc).__name__)[:_MAX_MESSAGE_CHARS], False
            log.warning("adapter %s of %s failed: %s", message.action, message.name, text)
        self._publish(AdapterResult(request_id=message.request_id, action=message.action,
                                    name=message.name, ok=ok, message=text, at=time.time()))

    def _load(self, engine: Any, name: str, path: str) -> str:
        """Load (or replace: jobs already running keep the old weights) adapter ``name``."""
        if name == self.base:
            raise ValueError(f"an adapter may not be named like its base model ({name!r})")
        folder = str(adapter_folder(path))
        if not callable(getattr(engine, "add_lora", None)):
            raise ValueError("this worker's engine has no LoRA support")
        if getattr(getattr(engine, "config", None), "max_loras", 0) < 1:
            raise ValueError("LoRA is off on this worker: start it with KVRELAY_MAX_LORAS of "
                             "1 or more (or with KVRELAY_LORA_MODULES)")
        engine.add_lora(name, folder)
        replaced = name in self._held
        self._held[name] = _Held(path=folder, loaded_at=time.time())
        log.info("adapter %s %s from %s", name, "replaced" if replaced else "loaded", folder)
        return f"adapter {name!r} {'replaced' if replaced else 'loaded'} from {folder}"

    def _unload(self, engine: Any, name: str) -> str:
        """Take ``name`` out of service: new jobs naming it are refused, running ones
        finish with it, then the engine frees it."""
        if self._held.pop(name, None) is None:
            raise ValueError(f"this worker holds no adapter {name!r}")
        engine.remove_lora(name)
        log.info("adapter %s unloaded", name)
        return f"adapter {name!r} unloaded"

    def _publish(self, result: AdapterResult | None = None) -> None:
        """Swap in what the heartbeat shows (and append ``result``)."""
        advertised = [AdapterInfo(name=n, base=self.base, path=h.path, loaded_at=h.loaded_at)
                      for n, h in sorted(self._held.items())]
        with self._lock:
            self._advertised = advertised
            if result is not None:
                self._results.append(result)
