"""Typed reads of a decoded JSON body, each failure a 400 naming the field's path."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from kvrelay.gateway.errors import bad_request

T = TypeVar("T")


def convert(value: Any, kind: type[T], param: str) -> T:
    """``value`` as ``kind`` (msgspec's checks: types, bounds, ``__post_init__``)."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at ")
        if not message:
            message, where = str(exc), "$"
        path = param + where.strip("`").removeprefix("$")
        path = path.removeprefix(".")
        raise bad_request(f"{path}: {message}" if path else message, path or None) from None


def json_type(value: Any) -> str:
    """JSON's name for the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names: dict[type, str] = {dict: "object", list: "array", str: "string"}
    return names.get(type(value), type(value).__name__)


def expect_object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{param}: expected an object, got {json_type(value)}", param)
    return value


def expect_list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise bad_request(f"{param}: expected an array, got {json_type(value)}", param)
    return value


def expect_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{param}: expected a string, got {json_type(value)}", param)
    return value
