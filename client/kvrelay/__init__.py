"""kvrelay: queue-backed LLM inference. This package is the light client SDK and CLI.

Importing it pulls in redis-py and msgspec only (Celery is loaded on the first enqueue):
no torch, transformers, triton or numpy.
"""

import warnings
from typing import Any

from kvrelay.client import AsyncClient
from kvrelay.completion import Choice, Completion, StreamChunk
from kvrelay.errors import (
    BrokerUnavailable,
    Cancelled,
    ControlTimeout,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    JobIdReused,
    KvrelayError,
    LogTruncated,
    PayloadTooLarge,
    PromptTooLong,
    ProtocolVersionError,
    QueueFull,
    QueueTimeout,
    SlowReader,
    StreamTimeout,
    UnknownJob,
    UnknownModel,
    WorkerLost,
)
from kvrelay.protocol import TokenLogprob, TopLogprob, Usage, WorkerInfo
from kvrelay.request_builder import GenerateOptions
from kvrelay.stream import AsyncStream
from kvrelay.sync_client import Client, Stream

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "BrokerUnavailable",
    "Cancelled",
    "Choice",
    "Client",
    "Completion",
    "ControlTimeout",
    "DeadlineExceeded",
    "GenerateOptions",
    "InternalError",
    "InvalidRequest",
    "JobIdReused",
    "KvrelayError",
    "LogTruncated",
    "PayloadTooLarge",
    "PromptTooLong",
    "ProtocolVersionError",
    "QueueFull",
    "QueueTimeout",
    "SlowReader",
    "Stream",
    "StreamChunk",
    "StreamTimeout",
    "TokenLogprob",
    "TopLogprob",
    "UnknownJob",
    "UnknownModel",
    "Usage",
    "WorkerInfo",
    "WorkerLost",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # ``kvrelay.ConnectionError`` shadowed the builtin; kept working, with a warning.
    if name == "ConnectionError":
        warnings.warn(
            "kvrelay.ConnectionError is deprecated; use kvrelay.BrokerUnavailable "
            "(also a builtin ConnectionError)",
            DeprecationWarning,
            stacklevel=2,
        )
        return BrokerUnavailable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
