"""Every sampling option gets the same accept/reject decision at all three doors.

The doors: the SDK (``build_request``, before anything is enqueued), a raw payload through
the worker's decode path (as Celery's JSON delivers it, and as JSON text), and the
engine's ``SamplingParams`` (also the offline ``LLM`` API). Each field goes through its
boundary values: below the minimum, the minimum, the maximum, above it, NaN, +-inf, 2**63
and a wrong type. The bounds are written here as literals on purpose: this table is the
documented contract (README, "SDK options"), checked against the code.

A refusal must be the door's typed error (``InvalidRequest``, ``JobRejected`` with
``invalid_request``, ``SamplingParamsError``); any other exception fails the test.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from kvrelay import InvalidRequest
from kvrelay.protocol import GenerateRequest, request_to_payload
from kvrelay.request_builder import build_request
from kvrelay_worker.engine import SamplingParams, SamplingParamsError
from kvrelay_worker.intake.job_request import JobRejected, decode_payload, sampling_params_from

NAN, INF = math.nan, math.inf
BIG = 2**63  # one past int64: the value that once crashed a whole engine step
JOB, MODEL = "job-1", "m"
MAX_ID = 2**31 - 1  # the largest token id anywhere in the options


def ints(low: int, high: int) -> list[tuple[Any, bool]]:
    """Boundary rows of an integer option in [low, high]."""
    return [(low - 1, False), (low, True), (high, True), (high + 1, False), (NAN, False),
            (INF, False), (-INF, False), (BIG, high >= BIG), (-BIG - 1, False),
            ("1", False), (True, False), (1.5, False), ([1], False)]


def floats(low: float, high: float, *, low_open: bool = False) -> list[tuple[Any, bool]]:
    """Boundary rows of a float option in [low, high] ((low, high] when ``low_open``)."""
    return [(low - 0.5, False), (low, not low_open), (high, True), (high + 0.5, False),
            (NAN, False), (INF, False), (-INF, False), (BIG, False), ("0.5", False),
            (True, False), ([0.5], False)]


# field -> [(value, accepted)]; some rows carry other options they need (see CONTEXT).
TABLE: dict[str, list[tuple[Any, bool]]] = {
    "n": ints(1, 128),
    "max_tokens": [*ints(1, 2**24), (None, True)],
    "min_tokens": ints(0, 2**24),
    "temperature": floats(0.0, 100.0),
    "top_p": floats(0.0, 1.0, low_open=True),
    "top_k": ints(-1, 2**20),
    "min_p": floats(0.0, 1.0),
    "repetition_penalty": floats(0.0, 100.0, low_open=True),
    "presence_penalty": floats(-2.0, 2.0),
    "frequency_penalty": floats(-2.0, 2.0),
    "seed": [*ints(-(2**63), 2**63 - 1), (None, True)],
    "logprobs": [*ints(0, 20), (None, True)],
    "prompt_logprobs": [*ints(0, 20), (None, True)],
    "ignore_eos": [(True, True), (False, True), (1, False), ("yes", False), (NAN, False),
                   (BIG, False)],
    "stop": [([], True), (["a"], True), (["x" * 256], True), (["x" * 257], False),
             ([""], False), (["s"] * 16, True), (["s"] * 17, False), ([1], False),
             ([NAN], False), ([INF], False), ([BIG], False), (5, False), ({"a": 1}, False)],
    "stop_token_ids": [([], True), ([0], True), ([MAX_ID], True), ([MAX_ID + 1], False),
                       ([-1], False), ([BIG], False), ([NAN], False), ([INF], False),
                       ([1.5], False), ([True], False), (["a"], False),
                       (list(range(256)), True), (list(range(257)), False), (5, False)],
    "logit_bias": [({}, True), ({0: -100.0}, True), ({MAX_ID: 100}, True),
                   ({1: 100.5}, False), ({1: -101}, False), ({1: NAN}, False),
                   ({1: INF}, False), ({1: -INF}, False), ({-1: 1.0}, False),
                   ({MAX_ID + 1: 1.0}, False), ({BIG: 1.0}, False), ({1: BIG}, False),
                   ({1: "x"}, False), ({t: 1.0 for t in range(300)}, True),
                   ({t: 1.0 for t in range(301)}, False), ([1], False)],
    "best_of": [*ints(1, 128), (None, True)],
    "beam_width": ints(1, 16),
    "length_penalty": floats(-10.0, 10.0),
    "early_stopping": [(True, True), (False, True), ("never", True), ("always", False),
                       (1, False), (NAN, False)],
    "speculative": [(True, True), (False, True), (0, False), ("no", False), (BIG, False),
                    (NAN, False)],
    "response_format": [
        (None, True), ({"type": "text"}, True), ({"type": "json_object"}, True),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
         True),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"s": {"enum": ["x" * 40_000]}}}}}, False),
        ({"type": "regex", "pattern": "[a-z]+"}, True), ({"type": "regex", "pattern": ""}, False),
        ({"type": "regex", "pattern": "a" * 2049}, False),
        ({"type": "choice", "choices": ["yes", "no"]}, True),
        ({"type": "choice", "choices": []}, False), ({"type": "choice", "choices": [""]}, False),
        ({"type": "choice", "choices": ["c"] * 257}, False),
        ({"type": "grammar"}, False), ("json", False), (5, False), ({}, False)],
}
# Options a row needs beside its own: min_tokens must not exceed max_tokens.
CONTEXT: dict[str, dict[str, Any]] = {"min_tokens": {"max_tokens": None}}
# Rules that span two fields.
CROSS: list[tuple[dict[str, Any], bool]] = [
    ({"min_tokens": 5, "max_tokens": 5}, True),
    ({"min_tokens": 5, "max_tokens": 4}, False),
    ({"min_tokens": 2**24, "max_tokens": None}, True),
    ({"n": 3, "best_of": 2}, False),
    ({"n": 3, "best_of": 3}, True),
    ({"n": 3, "best_of": 128}, True),
    ({"n": 128, "best_of": 127}, False),
    ({"n": 3, "best_of": None}, True),
    ({"beam_width": 4, "n": 4}, True),
    ({"beam_width": 4, "n": 5}, False),
    ({"beam_width": 2, "best_of": 2}, False),
    ({"beam_width": 2, "logprobs": 1}, False),
    ({"beam_width": 2, "repetition_penalty": 1.1}, False),
    ({"beam_width": 2, "stop": ["x"]}, False),
    ({"beam_width": 2, "response_format": {"type": "json_object"}}, False),
    ({"beam_width": 2, "temperature": 0.7}, True),  # ignored by beam search, as in HF
    # max_tokens 0 scores the prompt alone: only with prompt_logprobs.
    ({"max_tokens": 0, "prompt_logprobs": 0}, True),
    ({"max_tokens": 0, "prompt_logprobs": None}, False),
    ({"max_tokens": -1, "prompt_logprobs": 1}, False),
]

CASES = [({**CONTEXT.get(field, {}), field: value}, ok)
         for field, rows in TABLE.items() for value, ok in rows] + CROSS


def case_id(case: tuple[dict[str, Any], bool]) -> str:
    options, ok = case
    return ("ok " if ok else "no ") + ",".join(f"{k}={v!r}"[:40] for k, v in options.items())


# ------------------------------------------------------------------------------ doors


def sdk_accepts(options: dict[str, Any]) -> bool:
    try:
        build_request("hi", options, default_model=MODEL)
    except InvalidRequest:
        return False
    return True


def _worker_accepts(payload: object) -> bool:
    try:
        request, _json = decode_payload(payload, JOB, MODEL, 1 << 20)
        sampling_params_from(request)
    except JobRejected as rejected:
        refused_as = rejected.code
    else:
        return True
    assert refused_as == "invalid_request"
    return False


def payload_accepts(options: dict[str, Any]) -> tuple[bool, bool]:
    """(as Celery's JSON hands the worker a dict, as the JSON text itself)."""
    payload = request_to_payload(GenerateRequest(job_id=JOB, model=MODEL, prompt="hi"))
    payload.setdefault("sampling", {}).update(options)
    text = json.dumps(payload)  # Python's json, like kombu's: NaN and Infinity pass through
    return _worker_accepts(json.loads(text)), _worker_accepts(text)


def engine_accepts(options: dict[str, Any]) -> bool:
    try:
        SamplingParams(**options)
    except SamplingParamsError:
        return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_same_decision_at_every_door(case: tuple[dict[str, Any], bool]) -> None:
    options, expected = case
    as_dict, as_text = payload_accepts(options)
    decisions = {"sdk": sdk_accepts(options), "payload": as_dict, "payload json": as_text,
                 "SamplingParams": engine_accepts(options)}
    assert decisions == dict.fromkeys(decisions, expected)


def test_every_sampling_field_is_in_the_table() -> None:
    """A field added to the wire struct without boundary rows fails here."""
    from kvrelay.protocol import SamplingOptions

    assert set(TABLE) == set(SamplingOptions.__struct_fields__)


@pytest.mark.parametrize(("priority", "expected"),
                         [(p, ok) for p, ok in ints(-(2**31), 2**31 - 1)])
def test_priority_is_bounded_at_the_sdk_and_the_worker(priority: Any, expected: bool) -> None:
    """``priority`` is a request field, not a sampling option: two doors."""
    try:
        build_request("hi", {"priority": priority}, default_model=MODEL)
        sdk = True
    except InvalidRequest:
        sdk = False
    payload = request_to_payload(GenerateRequest(job_id=JOB, model=MODEL, prompt="hi"))
    payload["priority"] = priority
    text = json.dumps(payload)
    assert (sdk, _worker_accepts(json.loads(text)), _worker_accepts(text)) == (expected,) * 3
