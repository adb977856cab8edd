"""``response_format=``: OpenAI's forms and vLLM's two extras pass, each malformed or
oversized one is an ``InvalidRequest`` naming the option, before anything is enqueued."""

from __future__ import annotations

from typing import Any

import pytest

from kvrelay.errors import InvalidRequest
from kvrelay.protocol import (
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_PATTERN_CHARS,
    MAX_SCHEMA_BYTES,
    ChoiceFormat,
    JsonObjectFormat,
    JsonSchemaFormat,
    RegexFormat,
    TextFormat,
    decode_request_json,
    encode_request,
)
from kvrelay.request_builder import build_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(("given", "kind"), [
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}, JsonSchemaFormat),
    ({"type": "json_object"}, JsonObjectFormat),
    ({"type": "text"}, TextFormat),
    ({"type": "regex", "pattern": "[a-z]+"}, RegexFormat),
    ({"type": "choice", "choices": ["a", "b"]}, ChoiceFormat),
])
def test_accepted_forms_travel(given: dict[str, Any], kind: type) -> None:
    request, _ = build_request("x", {"response_format": given}, default_model="m")
    assert isinstance(request.sampling.response_format, kind)
    again = decode_request_json(encode_request(request))
    assert again.sampling.response_format == request.sampling.response_format


@pytest.mark.parametrize(("given", "words"), [
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": "not an object"}}, "schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"d": "x" * MAX_SCHEMA_BYTES}}},
     "bytes"),
    ({"type": "regex", "pattern": ""}, "pattern"),
    ({"type": "regex", "pattern": "a" * (MAX_PATTERN_CHARS + 1)}, "pattern"),
    ({"type": "choice", "choices": []}, "choices"),
    ({"type": "choice", "choices": ["a"] * (MAX_CHOICES + 1)}, "choices"),
    ({"type": "choice", "choices": ["a" * (MAX_CHOICE_CHARS + 1)]}, "choices"),
    ({"type": "grammar", "grammar": "root ::= x"}, "type"),
    ("json", "response_format"),
])
def test_malformed_is_invalid_request(given: Any, words: str) -> None:
    with pytest.raises(InvalidRequest, match="response_format") as caught:
        build_request("x", {"response_format": given}, default_model="m")
    assert words in str(caught.value)
