"""The wire types of LoRA adapters: a request's adapter name, the control message that
loads or unloads one on live workers, and what a worker's heartbeat says of its adapters.

Kept apart from ``kvrelay.protocol`` (which re-exports every name here) so the contract
of one feature reads in one place; the same rules hold: fields are only appended, with
defaults. An adapter belongs to one base model: its jobs go to that model's queue and
carry ``GenerateRequest.lora``; a worker that does not hold the adapter fails the job as
``invalid_request``.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "ADAPTER_NAME_PATTERN",
    "MAX_ADAPTER_NAME_CHARS",
    "MAX_ADAPTER_PATH_CHARS",
    "MAX_ADAPTER_RESULTS",
    "AdapterInfo",
    "AdapterMessage",
    "AdapterName",
    "AdapterResult",
    "adapter_name_error",
]

# An adapter's name: what a request's ``lora`` says and what the gateway lists as a model
# id. Printable and short (no whitespace or braces: it may stand where a model name does).
MAX_ADAPTER_NAME_CHARS: Final = 128
ADAPTER_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._:/@+\-]*\Z"  # \Z: "$" lets "\n" end it
# A path (or Hugging Face name) on the worker's machine, as a load message carries it.
MAX_ADAPTER_PATH_CHARS: Final = 4096
# How many recent load/unload results a worker's heartbeat keeps (the newest last).
MAX_ADAPTER_RESULTS: Final = 16

AdapterName = Annotated[str, Meta(min_length=1, max_length=MAX_ADAPTER_NAME_CHARS,
                                  pattern=ADAPTER_NAME_PATTERN)]
AdapterPath = Annotated[str, Meta(min_length=1, max_length=MAX_ADAPTER_PATH_CHARS)]
RequestId = Annotated[str, Meta(min_length=1, max_length=64)]


def adapter_name_error(value: object) -> str | None:
    """Why ``value`` cannot name an adapter (None when it can): one rule for the SDK, the
    worker's settings and the CLI, from the wire type itself."""
    try:
        msgspec.convert(value, AdapterName)
    except msgspec.ValidationError:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return (f"an adapter name is 1 to {MAX_ADAPTER_NAME_CHARS} letters, digits and "
                f"'._:/@+-', starting with a letter or digit; got {shown}")
    return None


class AdapterMessage(msgspec.Struct, tag="adapter", tag_field="type", kw_only=True,
                     omit_defaults=True):
    """Broadcast on the control channel: load (or unload) adapter ``name`` on the live
    workers of ``model`` (every worker holding it when ``model`` is None, for unload).

    ``request_id`` comes back in each worker's heartbeat (``AdapterResult``), so the
    sender learns which workers did it and why the others could not.
    """

    action: Literal["load", "unload"]
    name: AdapterName
    request_id: RequestId
    model: str | None = None
    # Load only: a PEFT adapter folder on the worker's machine.
    path: AdapterPath | None = None


class AdapterInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One adapter a worker holds: jobs of ``base`` with ``lora=name`` run with it."""

    name: str
    base: str
    path: str = ""
    loaded_at: float = 0.0


class AdapterResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a worker did with one ``AdapterMessage`` (``ok`` False: ``message`` says why)."""

    request_id: str
    action: str
    name: str
    ok: bool
    message: str = ""
    at: float = 0.0
