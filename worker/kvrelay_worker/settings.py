"""Worker configuration from ``KVRELAY_*`` environment variables, validated at start.

The ``kvrelay worker`` command turns its flags into these variables, so a worker started
through plain ``celery -A kvrelay_worker.app worker`` reads exactly the same settings.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property

from kvrelay.connection import DEFAULT_REDIS_URL as DEFAULT_REDIS_URL
from kvrelay.connection import redact_url
from kvrelay.event_log import LIVE_LOG_TTL_S
from kvrelay.keys import Keyspace, NamespaceError
from kvrelay.queue_push import MAX_QUEUE_TIMEOUT_S
from kvrelay.sentinel_url import SentinelUrlError, is_sentinel_url, parse_sentinel_url
from kvrelay.tls import TlsConfigError, celery_ssl_options
from kvrelay_worker.engine.options import (  # torch-free
    KV_CACHE_DTYPE_CHOICES,
    MAX_LORA_RANK,
    PREEMPTION_MODES,
    QUANTIZATION_GROUP_SIZES,
    QUANTIZATIONS,
)
from kvrelay_worker.engine.spec.speculative_config import (  # torch-free
    DEFAULT_NGRAM_MAX,
    DEFAULT_NGRAM_MIN,
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    DEFAULT_SPECULATIVE,
    SpeculativeSettingError,
    check_num_speculative_tokens,
    describe_speculative,
    parse_ngram_range,
    parse_speculative,
)
from kvrelay_worker.engine.tools.model_parsers import AUTO, check_parser_setting  # torch-free
from kvrelay_worker.engine.tools.plan import REASONING_FORMATS, TOOL_FORMATS  # torch-free
from kvrelay_worker.loading.hub_name import default_served_name  # torch-free
from kvrelay_worker.served_adapters import (  # torch-free
    AdapterSettingError,
    parse_lora_modules,
)

# The reserved model name of the simulated engine (kvrelay_worker/simulated; also
# ``simulated:<name>``): no weights, steps that sleep as a GPU's would.
SIMULATED_MODEL = "simulated"


def is_simulated_model(model: str) -> bool:
    return model == SIMULATED_MODEL or model.startswith(SIMULATED_MODEL + ":")


class SettingsError(ValueError):
    """A ``KVRELAY_*`` variable has a value the worker cannot use."""


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WorkerSettings:
    """Everything one worker process needs to know (see the README's configuration table)."""

    redis_url: str = DEFAULT_REDIS_URL
    # The tenant: every key, channel and queue this worker uses starts with its prefix.
    namespace: str = ""
    # What to load: a known name, a Hugging Face folder, a .gguf file or a Hugging Face
    # Hub repository, org/name[@revision][:QUANT] (fetched into the Hugging Face cache).
    model: str = "smollm2-135m-instruct"
    # The name clients ask for (and the queue's name); defaults to ``model``, the
    # folder's / file's name when ``model`` is a path, org/name for a repository.
    model_name: str = ""
    device: str = "auto"
    dtype: str = "auto"
    concurrency: int = 64
    metrics_port: int | None = None
    # The metrics server's address: loopback unless told otherwise (it is unauthenticated).
    metrics_host: str = "127.0.0.1"
    # Lease: how long a job stays owned without a refresh, and the refresh period.
    lease_ttl: float = 5.0
    lease_refresh: float = 1.0
    # How often live workers look for jobs whose owner died.
    watchdog_interval: float = 1.0
    # A held job whose engine step and event writes have not moved for this long is
    # stuck: its lease is no longer refreshed, so another worker takes it over.
    stall_timeout: float = 30.0
    # A job whose workers died this many times fails with worker_lost.
    max_attempts: int = 3
    # Taken-over jobs' re-prefill one worker holds at once, in seconds of its measured
    # prefill rate: a copy past that goes back to the queue for another survivor.
    takeover_target_s: float = 8.0
    # Celery's redelivery of unacknowledged messages: the last resort, longer than any job.
    visibility_timeout: float = 6 * 3600.0
    # kombu's restore sweep of unacknowledged messages: every interval x throttle seconds.
    unacked_restore_interval: float = 10.0
    unacked_restore_throttle: int = 10
    # On SIGTERM: how long running jobs may take to finish before being handed back.
    shutdown_grace: float = 30.0
    max_payload_bytes: int = 1 << 20
    # Seconds any Redis call of the worker may take (connect, read, write) before it fails:
    # no thread waits forever on a Redis that stopped answering.
    redis_socket_timeout: float = 30.0
    # Queue limit: jobs the model's queue may hold (0: no limit), advertised to clients and
    # enforced with each push; the retry hint (seconds) a refused client gets.
    max_queue: int = 4096
    queue_retry_after: float = 1.0
    # The longest a job may have waited when picked up (from its enqueue time), for
    # payloads that carry no queue deadline of their own; at most MAX_QUEUE_TIMEOUT_S.
    max_queue_wait: float = MAX_QUEUE_TIMEOUT_S
    # Event log: bounded length, how long it lives after the job ends, and how long the
    # log of a job still running lives past its latest event.
    log_max_len: int = 100_000
    # ... and bounded in bytes (the oldest entries go first).
    log_max_bytes: int = 32 << 20
    log_ttl: float = 3600.0
    log_live_ttl: float = float(LIVE_LOG_TTL_S)
    # Engine options.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    target_step_ms: float | None = None
    max_model_len: int | None = None
    kv_cache_memory: int | None = None
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    preemption_mode: str | None = None
    swap_space_gib: float | None = None
    # Weight-only quantization: auto, none, int8, int4 or gguf (EngineConfig.quantization).
    quantization: str = "auto"
    quantization_group_size: int = 32
    # torch's intra-op threads on CPU (cpu_threads.py); unset: as OMP_NUM_THREADS asked
    # when it is set, else the CPUs this process may use (affinity mask and cgroup quota).
    cpu_threads: int | None = None
    enable_prefix_caching: bool = True
    enable_cuda_graphs: bool = True
    seed: int = 0
    # Speculative decoding: off, ngram or draft:<model>; k, the most draft tokens per
    # sequence per step; the n-gram lengths prompt lookup tries, "MIN-MAX" or one number.
    speculative: str = DEFAULT_SPECULATIVE
    speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    speculative_ngram: str = f"{DEFAULT_NGRAM_MIN}-{DEFAULT_NGRAM_MAX}"
    # The syntax the model writes tool calls and reasoning in (engine/tools): auto (read
    # from its chat template), none, or a format's name.
    tool_parser: str = AUTO
    reasoning_parser: str = AUTO
    # The simulated engine (model ``simulated`` or ``simulated:<name>``): each step takes
    # step_ms + token_ms x the tokens it batches, as a GPU would (kvrelay_worker/simulated).
    simulated_step_ms: float = 20.0
    simulated_token_ms: float = 0.08
    # LoRA adapters loaded at start, "name=path,name2=path2" (docs/adapters.md); the engine's
    # adapter slots (unset: one per adapter named here, 0 without: LoRA off) and their
    # largest rank (unset: the engine's default).
    lora_modules: str = ""
    max_loras: int | None = None
    max_lora_rank: int | None = None
    worker_id: str = field(default_factory=_worker_id)

    def __post_init__(self) -> None:
        # NaN and infinity slip through every comparison below (LEASE_TTL=nan made every
        # claim raise), so each number must first be finite.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingsError(f"KVRELAY_{f.name.upper()} must be a finite number, "
                                    f"got {value}")
        positive = {
            "concurrency": self.concurrency,
            "lease_ttl": self.lease_ttl,
            "lease_refresh": self.lease_refresh,
            "watchdog_interval": self.watchdog_interval,
            "stall_timeout": self.stall_timeout,
            "max_attempts": self.max_attempts,
            "takeover_target_s": self.takeover_target_s,
            "visibility_timeout": self.visibility_timeout,
            "max_payload_bytes": self.max_payload_bytes,
            "redis_socket_timeout": self.redis_socket_timeout,
            "log_max_len": self.log_max_len,
            "log_max_bytes": self.log_max_bytes,
            "log_ttl": self.log_ttl,
            "log_live_ttl": self.log_live_ttl,
            "queue_retry_after": self.queue_retry_after,
            "max_queue_wait": self.max_queue_wait,
        }
        for name, value in positive.items():
            if value <= 0:
                raise SettingsError(f"KVRELAY_{name.upper()} must be positive, got {value}")
        if self.max_queue < 0:
            raise SettingsError(f"KVRELAY_MAX_QUEUE must be >= 0 (0: no limit), got {self.max_queue}")
        if self.max_queue_wait > MAX_QUEUE_TIMEOUT_S:
            raise SettingsError(
                f"KVRELAY_MAX_QUEUE_WAIT must be at most {MAX_QUEUE_TIMEOUT_S:g}s (abort flags "
                f"must outlive any queue wait), got {self.max_queue_wait}"
            )
        if self.shutdown_grace < 0:
            raise SettingsError("KVRELAY_SHUTDOWN_GRACE must be >= 0")
        for name in ("simulated_step_ms", "simulated_token_ms"):
            if getattr(self, name) < 0:
                raise SettingsError(f"KVRELAY_{name.upper()} must be >= 0, "
                                    f"got {getattr(self, name)}")
        # Checked again by EngineConfig; here so a bad value fails before the model loads.
        if self.preemption_mode is not None and self.preemption_mode not in PREEMPTION_MODES:
            raise SettingsError(f"KVRELAY_PREEMPTION_MODE must be one of "
                                f"{', '.join(PREEMPTION_MODES)}, got {self.preemption_mode!r}")
        try:
            parse_speculative(self.speculative, "KVRELAY_SPECULATIVE")
            check_num_speculative_tokens(self.speculative_tokens, "KVRELAY_SPECULATIVE_TOKENS")
            parse_ngram_range(self.speculative_ngram, "KVRELAY_SPECULATIVE_NGRAM")
        except SpeculativeSettingError as exc:
            raise SettingsError(str(exc)) from None
        try:
            check_parser_setting(self.tool_parser, TOOL_FORMATS, "KVRELAY_TOOL_PARSER")
            check_parser_setting(self.reasoning_parser, REASONING_FORMATS,
                                 "KVRELAY_REASONING_PARSER")
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise SettingsError(f"KVRELAY_KV_CACHE_DTYPE must be one of "
                                f"{', '.join(KV_CACHE_DTYPE_CHOICES)}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise SettingsError(f"KVRELAY_QUANTIZATION must be one of "
                                f"{', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantization_group_size not in QUANTIZATION_GROUP_SIZES:
            raise SettingsError(f"KVRELAY_QUANTIZATION_GROUP_SIZE must be one of "
                                f"{', '.join(map(str, QUANTIZATION_GROUP_SIZES))}, "
                                f"got {self.quantization_group_size}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise SettingsError(f"KVRELAY_CPU_THREADS must be a positive integer (unset: the "
                                f"usable CPUs), got {self.cpu_threads}")
        if self.target_step_ms is not None and self.target_step_ms <= 0:
            raise SettingsError(f"KVRELAY_TARGET_STEP_MS must be positive (milliseconds), "
                                f"got {self.target_step_ms}")
        if self.swap_space_gib is not None and self.swap_space_gib < 0:
            raise SettingsError(f"KVRELAY_SWAP_SPACE_GIB must be >= 0, got {self.swap_space_gib}")
        if self.lease_refresh >= self.lease_ttl:
            raise SettingsError(
                f"KVRELAY_LEASE_REFRESH ({self.lease_refresh}) must be shorter than "
                f"KVRELAY_LEASE_TTL ({self.lease_ttl})"
            )
        if self.stall_timeout <= self.lease_refresh:
            raise SettingsError(
                f"KVRELAY_STALL_TIMEOUT ({self.stall_timeout}) must be longer than "
                f"KVRELAY_LEASE_REFRESH ({self.lease_refresh})"
            )
        if is_sentinel_url(self.redis_url):
            try:
                parse_sentinel_url(self.redis_url)
            except SentinelUrlError as exc:
                raise SettingsError(f"KVRELAY_REDIS_URL: {exc}") from None
        elif not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(
                f"KVRELAY_REDIS_URL must start with redis://, rediss://, unix:// or "
                f"redis+sentinel://, got {redact_url(self.redis_url)!r}"
            )
        try:
            celery_ssl_options(self.redis_url)
        except TlsConfigError as exc:
            raise SettingsError(f"KVRELAY_REDIS_URL: {exc}") from None
        try:
            Keyspace(self.namespace)
        except NamespaceError as exc:
            raise SettingsError(f"KVRELAY_NAMESPACE: {exc}") from None
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"KVRELAY_METRICS_PORT must be a port number, got {self.metrics_port}")
        if any(c in self.served_model for c in "{} \t\n"):
            raise SettingsError(
                f"model name {self.served_model!r} may not contain braces or whitespace; set "
                f"KVRELAY_MODEL_NAME"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise SettingsError(f"KVRELAY_DEVICE must be auto, cpu or cuda, got {self.device!r}")
        self._check_lora()

    def _check_lora(self) -> None:
        try:
            modules = parse_lora_modules(self.lora_modules)
        except AdapterSettingError as exc:
            raise SettingsError(str(exc)) from None
        if modules and self.simulated:
            raise SettingsError("KVRELAY_LORA_MODULES: the simulated engine has no LoRA support")
        if self.max_loras is not None and self.max_loras < len(modules):
            raise SettingsError(f"KVRELAY_MAX_LORAS ({self.max_loras}) must be at least the "
                                f"number of KVRELAY_LORA_MODULES ({len(modules)})")
        if self.max_lora_rank is not None and not 1 <= self.max_lora_rank <= MAX_LORA_RANK:
            raise SettingsError(f"KVRELAY_MAX_LORA_RANK must be 1 to {MAX_LORA_RANK}, "
                                f"got {self.max_lora_rank}")

    @property
    def lora_module_list(self) -> list[tuple[str, str]]:
        """``KVRELAY_LORA_MODULES`` as (name, path) pairs (validated at start)."""
        return parse_lora_modules(self.lora_modules)

    @cached_property
    def served_model(self) -> str:
        """The name jobs address (and the queue's): looked up once, it is read per job."""
        if self.model_name:
            return self.model_name
        # A path's name (org/name for a Hugging Face cache snapshot), a Hub repository's
        # org/name (its @revision left out), else the model string itself.
        return default_served_name(self.model)

    @property
    def simulated(self) -> bool:
        """Whether this worker runs the simulated engine instead of a model."""
        return is_simulated_model(self.model)

    @cached_property
    def keys(self) -> Keyspace:
        """Every Redis name of this worker's namespace."""
        return Keyspace(self.namespace)

    @property
    def host(self) -> str:
        return self.worker_id.split(":", 1)[0]

    @property
    def worker_name(self) -> str:
        """Host and process, as shown in ``Started`` events."""
        host, pid, _ = self.worker_id.split(":", 2)
        return f"{host}:{pid}"

    @property
    def speculative_summary(self) -> str:
        """The speculative-decoding setting in one phrase, for the worker's ready line."""
        low, high = parse_ngram_range(self.speculative_ngram)
        return describe_speculative(self.speculative, self.speculative_tokens, low, high)

    def engine_options(self) -> dict[str, object]:
        """Keyword arguments for ``EngineConfig``: only what was set, and the speculative
        settings (their defaults are the engine's, from one module)."""
        ngram_min, ngram_max = parse_ngram_range(self.speculative_ngram)
        options: dict[str, object] = {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_cuda_graphs": self.enable_cuda_graphs,
            "seed": self.seed,
            "quantization": self.quantization,
            "quantization_group_size": self.quantization_group_size,
            "max_num_seqs": self.max_num_seqs or max(self.concurrency, 1),
            "speculative": self.speculative,
            "num_speculative_tokens": self.speculative_tokens,
            "speculative_ngram_min": ngram_min,
            "speculative_ngram_max": ngram_max,
            "max_loras": (self.max_loras if self.max_loras is not None
                          else len(self.lora_module_list)),
        }
        optional = {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "target_step_ms": self.target_step_ms,
            "max_model_len": self.max_model_len,
            "kv_cache_memory": self.kv_cache_memory,
            "kv_cache_dtype": self.kv_cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "preemption_mode": self.preemption_mode,
            "swap_space_gib": self.swap_space_gib,
            "max_lora_rank": self.max_lora_rank,
        }
        options.update({k: v for k, v in optional.items() if v is not None})
        return options

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "worker_id":
                continue
            raw = env.get(f"KVRELAY_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, str(f.type), raw)
        return cls(**values)  # type: ignore[arg-type]


def _parse(name: str, type_name: str, raw: str) -> object:
    var = f"KVRELAY_{name.upper()}"
    try:
        if "bool" in type_name:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "int" in type_name:
            return int(raw)
        if "float" in type_name:
            return float(raw)
    except ValueError:
        kind = "true/false" if "bool" in type_name else type_name.split(" ")[0]
        raise SettingsError(f"{var} must be {kind}, got {raw!r}") from None
    return raw
