"""Whether kvrelay traces, and the tracer it traces with: asked once per job, cheaply.

Tracing is on when OpenTelemetry's SDK is installed and configured, in one of two ways:

- the application installed a tracer provider (``trace.set_tracer_provider``, or
  ``opentelemetry-instrument``): kvrelay's spans go there, beside the application's;
- no provider is installed, but the standard variables ask for an exporter
  (``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``KVRELAY_TRACES_FILE`` names a file: the
  first job installs a provider built from them (``env_setup``). This is how a worker
  or a gateway, which are processes of their own, are told to trace.

Otherwise tracing is off and a job pays one module lookup: the variables are read once,
and while no code of the process imported OpenTelemetry no provider can be installed,
so nothing imports it. ``OTEL_SDK_DISABLED=true`` keeps kvrelay from installing one.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["TRACES_FILE", "active_tracer", "configure", "flush", "summary"]

log = logging.getLogger("kvrelay.tracing")

# A path: every span this process ends is also written there as one JSON line.
TRACES_FILE: Final = "KVRELAY_TRACES_FILE"
# The instrumentation scope kvrelay's spans carry.
TRACER_NAME: Final = "kvrelay"

_tracer: Tracer | None = None
_env_read = False
_lock = threading.Lock()
# What the variables asked for (for ``summary``), and the provider kvrelay installed.
_asked: list[str] = []
_installed: Any = None
# ``OTEL_PYTHON_TRACER_PROVIDER`` names a provider the API loads on first use.
_provider_named = False
_UNKNOWN = object()
# The service name of a provider installed here when the variables give none.
_service = "kvrelay"


def active_tracer() -> Tracer | None:
    """kvrelay's tracer, or None while tracing is off (see the module's docstring)."""
    if _tracer is not None:
        return _tracer
    if not _env_read:
        _read_env()
    api = sys.modules.get("opentelemetry.trace")
    if api is None:  # nothing imported OpenTelemetry: no provider can be installed
        return None
    return _adopt(api)


def _adopt(api: Any) -> Tracer | None:
    """Use the installed provider, if one is (one is installed once per process, so the
    tracer is kept); None while the provider is still OpenTelemetry's placeholder."""
    global _tracer
    if getattr(api, "_TRACER_PROVIDER", _UNKNOWN) is None and not _provider_named:
        # The API's own record says none is installed: asking ``get_tracer_provider`` would
        # cost a failed ``os.environ`` lookup (an exception) per job to say the same.
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    _tracer = provider.get_tracer(TRACER_NAME)
    return _tracer


def _read_env() -> None:
    """Install a provider from the variables when they ask for one (once per process)."""
    global _env_read, _installed, _provider_named
    with _lock:
        if _env_read:
            return
        try:
            _provider_named = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))
            exporters = _exporters_asked()
            traces_file = os.environ.get(TRACES_FILE) or None
            _asked.extend(exporters + ([f"file {traces_file}"] if traces_file else []))
            if _asked and not _sdk_disabled():
                from kvrelay.tracing.env_setup import install

                _installed = install(exporters, traces_file, _service)
        except ImportError as exc:
            log.warning("tracing is asked for (%s) but OpenTelemetry's SDK is missing (%s); "
                        "install kvrelay[tracing]", ", ".join(_asked), exc)
        except Exception as exc:  # a bad exporter setting never stops the process
            log.warning("could not set up tracing from the environment: %s", exc)
        finally:
            _env_read = True


def _exporters_asked() -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names; ``otlp`` when it is unset but an OTLP
    endpoint is; none otherwise."""
    named = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if named:
        names = [name.strip() for name in named.split(",") if name.strip()]
        return [] if "none" in names else names
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered (a process that exits without interpreter teardown,
    as a worker does, would lose them)."""
    if _tracer is None:
        return
    api = sys.modules.get("opentelemetry.trace")
    provider = api.get_tracer_provider() if api is not None else None
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(int(timeout_s * 1000))
        except Exception as exc:
            log.warning("could not flush the last spans: %s", exc)


def configure(service: str) -> str:
    """Set tracing up now (a process's start: a worker, a gateway), naming the service
    when the variables do not; returns ``summary()``."""
    global _service
    if not _env_read:
        _service = service
    return summary()


def summary() -> str:
    """What this process traces to, for a start-up log line."""
    if active_tracer() is None:
        return "off"
    if _installed is not None:
        return "on (" + ", ".join(_asked) + ")"
    return "on (the application's tracer provider" + (
        ", plus " + ", ".join(_asked) if _asked else "") + ")"
