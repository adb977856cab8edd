"""The SDK's error tree: wire codes map to classes, and no class shadows a builtin."""

from __future__ import annotations

import builtins
import inspect

import pytest

import kvrelay
from kvrelay import errors
from kvrelay.errors import error_for_code
from kvrelay.protocol import ErrorCode

WIRE = {
    ErrorCode.INVALID_REQUEST: kvrelay.InvalidRequest,
    ErrorCode.PROMPT_TOO_LONG: kvrelay.PromptTooLong,
    ErrorCode.PAYLOAD_TOO_LARGE: kvrelay.PayloadTooLarge,
    ErrorCode.PROTOCOL_VERSION: kvrelay.ProtocolVersionError,
    ErrorCode.UNKNOWN_MODEL: kvrelay.UnknownModel,
    ErrorCode.QUEUE_FULL: kvrelay.QueueFull,
    ErrorCode.DEADLINE_EXCEEDED: kvrelay.DeadlineExceeded,
    ErrorCode.CANCELLED: kvrelay.Cancelled,
    ErrorCode.WORKER_LOST: kvrelay.WorkerLost,
    ErrorCode.INTERNAL: kvrelay.InternalError,
}


@pytest.mark.parametrize(("code", "cls"), WIRE.items())
def test_each_wire_code_raises_its_class(code: str, cls: type[kvrelay.KvrelayError]) -> None:
    error = error_for_code(code, "why", job_id="j")
    assert type(error) is cls
    assert (error.code, str(error)) == (code, "why (job j)")


@pytest.mark.parametrize("code", ["stream_timeout", "connection_error", "no_such_code"])
def test_client_side_and_unknown_codes_are_internal(code: str) -> None:
    """A worker cannot make the SDK raise a client-side error (or anything unregistered)."""
    assert type(error_for_code(code, "x")) is kvrelay.InternalError


def test_no_exported_class_shadows_a_builtin() -> None:
    assert [name for name in kvrelay.__all__ if hasattr(builtins, name)] == []


def test_old_connection_error_name_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="BrokerUnavailable"):
        old = kvrelay.ConnectionError
    assert old is kvrelay.BrokerUnavailable
    assert issubclass(kvrelay.BrokerUnavailable, builtins.ConnectionError)
    assert kvrelay.BrokerUnavailable("x").code == "connection_error"


def test_every_error_class_is_exported_from_the_package() -> None:
    """Callers catch ``kvrelay.X``: an error raised to them but missing there (or from
    ``__all__``) can only be caught through the private module."""
    defined = {name for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, kvrelay.KvrelayError)}
    assert defined - set(kvrelay.__all__) == set()
    assert all(getattr(kvrelay, name) is getattr(errors, name) for name in defined)
