"""kvrelay: queue-backed LLM inference. This package is the light client SDK and CLI.

Importing it pulls in redis-py and msgspec only (Celery is loaded on the first enqueue):
no torch, transformers, triton or numpy.
"""

from kvrelay.client import AsyncClient
from kvrelay.completion import Choice, Completion, StreamChunk
from kvrelay.errors import (
    Cancelled,
    ConnectionError,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    KvrelayError,
    PayloadTooLarge,
    PromptTooLong,
    ProtocolVersionError,
    QueueFull,
    StreamTimeout,
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
    "Cancelled",
    "Choice",
    "Client",
    "Completion",
    "ConnectionError",
    "DeadlineExceeded",
    "GenerateOptions",
    "InternalError",
    "InvalidRequest",
    "KvrelayError",
    "PayloadTooLarge",
    "PromptTooLong",
    "ProtocolVersionError",
    "QueueFull",
    "Stream",
    "StreamChunk",
    "StreamTimeout",
    "TokenLogprob",
    "TopLogprob",
    "UnknownModel",
    "Usage",
    "WorkerInfo",
    "WorkerLost",
    "__version__",
]
