"""``speculative=False`` travels from every door to the engine's ``SamplingParams``: the SDK
keyword, the job payload as Celery delivers it, the worker's decoder, and the gateway's
extra field. Left out, it is off the wire (``omit_defaults``) and True at the worker."""

from __future__ import annotations

import json

import msgspec
import pytest

from kvrelay.gateway.requests import ChatRequest, CompletionRequest
from kvrelay.protocol import SamplingOptions, request_to_payload
from kvrelay.request_builder import build_request
from kvrelay_worker.engine import SamplingParams
from kvrelay_worker.intake.job_request import decode_payload, sampling_params_from

MODEL = "m"


def worker_params(options: dict[str, object]) -> tuple[dict[str, object], SamplingParams]:
    """The payload the SDK enqueues for ``options``, and the engine's params from it."""
    request, _ = build_request("hi", options, default_model=MODEL)
    payload = json.loads(json.dumps(request_to_payload(request)))  # as Celery's JSON does
    decoded, _ = decode_payload(payload, request.job_id, MODEL, 1 << 20)
    return payload, sampling_params_from(decoded)


@pytest.mark.parametrize("value", [False, True])
def test_the_keyword_reaches_the_engine(value: bool) -> None:
    payload, params = worker_params({"speculative": value, "temperature": 0.0})
    assert params.speculative is value
    sampling = payload["sampling"]
    assert isinstance(sampling, dict)
    # The default is left off the wire, so older workers read the same payload.
    assert sampling.get("speculative", True) is value
    assert ("speculative" in sampling) is (not value)


def test_left_out_it_is_true_everywhere() -> None:
    _, params = worker_params({})
    assert params.speculative is True
    assert SamplingOptions().speculative is True
    assert SamplingParams().speculative is True
    assert SamplingParams.from_options(SamplingOptions(speculative=False)).speculative is False


@pytest.mark.parametrize("kind", [ChatRequest, CompletionRequest])
def test_the_gateway_maps_its_extra_field(kind: type[ChatRequest | CompletionRequest]) -> None:
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if kind is ChatRequest \
        else {"prompt": "hi"}
    body = json.dumps({"model": MODEL, "speculative": False, **prompt})
    options = msgspec.json.decode(body, type=kind).options()
    assert options["speculative"] is False
    unset = msgspec.json.decode(json.dumps({"model": MODEL, **prompt}), type=kind).options()
    assert "speculative" not in unset  # the SDK's default applies
