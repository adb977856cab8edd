"""``lora=``: checked by the SDK before anything is sent, carried on the wire, part of
what makes a job the same job, and refused by the worker's decoder when malformed."""

from __future__ import annotations

from typing import Any

import pytest

from kvrelay import AsyncClient, Client, InvalidRequest
from kvrelay.protocol import (
    MAX_ADAPTER_NAME_CHARS,
    ErrorCode,
    decode_request_json,
    encode_request,
    request_digest,
    request_to_payload,
)
from kvrelay.request_builder import build_request
from kvrelay_worker.intake.job_request import JobRejected, decode_payload


def build(now: float | None = None, **options: Any) -> Any:
    request, _settings = build_request("hi", options, default_model="m", now=now)
    return request


def test_the_adapter_travels_in_the_request() -> None:
    request = build(lora="tone-v2")
    assert request.lora == "tone-v2"
    assert decode_request_json(encode_request(request)).lora == "tone-v2"
    assert "lora" not in request_to_payload(build())  # no adapter: nothing on the wire
    # The adapter is part of what the job is: a retry with another one is another job.
    same = build(lora="tone-v2", job_id=request.job_id, now=request.enqueued_at)
    other = build(lora="style", job_id=request.job_id, now=request.enqueued_at)
    assert request_digest(same) == request_digest(request) != request_digest(other)


@pytest.mark.parametrize("name", ["a", "org/adapter-1.5", "x:y@2+b_c",
                                  "a" * MAX_ADAPTER_NAME_CHARS])
def test_names_the_gateway_can_list_are_accepted(name: str) -> None:
    assert build(lora=name).lora == name


@pytest.mark.parametrize("value", ["", " tone", "to ne", "{tone}", "-tone", "tone\n",
                                   "a" * (MAX_ADAPTER_NAME_CHARS + 1), 7, b"tone", ["tone"]])
def test_bad_names_fail_before_anything_is_sent(value: object) -> None:
    with pytest.raises(InvalidRequest, match=r"^lora: an adapter name is"):
        build(lora=value)


async def test_the_clients_check_it_at_the_call() -> None:
    # No Redis behind this URL: the call must fail on the argument, not on the network.
    client = AsyncClient("redis://127.0.0.1:1/0", model="m")
    try:
        with pytest.raises(InvalidRequest, match="lora"):
            client.stream("hi", lora="no spaces allowed")
    finally:
        await client.aclose()


def test_the_sync_client_takes_the_same_keyword() -> None:
    client = Client("redis://127.0.0.1:1/0", model="m")
    try:
        with pytest.raises(InvalidRequest, match="lora"):
            client.stream("hi", lora="")
    finally:
        client.close()


def test_the_worker_refuses_a_malformed_adapter_name() -> None:
    payload = request_to_payload(build(lora="tone"))
    payload["lora"] = "not a name"
    with pytest.raises(JobRejected) as caught:
        decode_payload(payload, payload["job_id"], "m", 1 << 20)
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert "lora" in caught.value.message
