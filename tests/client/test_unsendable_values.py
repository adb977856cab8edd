"""Values the SDK cannot honour are refused with ``InvalidRequest`` before anything is sent.

Text with a lone surrogate cannot be encoded as UTF-8 (it used to escape as a bare
``UnicodeEncodeError``); NaN and infinite durations used to be accepted and then made
waits spin (``stream_timeout=nan``) or never end (``inf``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import kvrelay
from kvrelay import AsyncClient

LONE_SURROGATE = "\udcff"
NOT_FINITE = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize(
    ("prompt", "options"),
    [
        (f"hello {LONE_SURROGATE}", {}),
        (None, {"messages": [{"role": "user", "content": LONE_SURROGATE}]}),
        ("hello", {"stop": [f"x{LONE_SURROGATE}"]}),
        ("hello", {"cache_salt": LONE_SURROGATE}),
    ],
)
async def test_unencodable_text_is_invalid_request(
        make_client: Any, prompt: str | None, options: dict[str, Any]) -> None:
    client: AsyncClient = make_client()
    with pytest.raises(kvrelay.InvalidRequest, match="UTF-8"):
        await client.generate(prompt, **options)


@pytest.mark.parametrize("value", NOT_FINITE)
@pytest.mark.parametrize("keyword", ["stream_timeout", "timeout"])
async def test_non_finite_call_durations_are_refused(
        make_client: Any, keyword: str, value: float) -> None:
    client: AsyncClient = make_client()
    with pytest.raises(kvrelay.InvalidRequest, match=keyword):
        await client.generate("hello", **{keyword: value})
    with pytest.raises(kvrelay.InvalidRequest, match=keyword):
        await client.resume("0" * 32, **{keyword: value})


@pytest.mark.parametrize("value", NOT_FINITE)
@pytest.mark.parametrize(
    "keyword", ["stream_timeout", "connect_timeout", "reconnect_timeout", "health_check_interval"])
async def test_non_finite_client_settings_are_refused(
        make_client: Any, keyword: str, value: float) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match=keyword):
        make_client(**{keyword: value})


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("max_queue", math.nan), ("max_queue", 1.5), ("enqueue_threads", math.inf),
     ("max_connections", math.nan), ("max_payload_bytes", math.inf), ("max_payload_bytes", 0)],
)
async def test_client_counts_must_be_ints(make_client: Any, keyword: str, value: float) -> None:
    with pytest.raises(kvrelay.InvalidRequest, match=keyword):
        make_client(**{keyword: value})


def test_sync_client_refuses_non_finite_settings() -> None:
    with pytest.raises(kvrelay.InvalidRequest, match="stream_timeout"):
        kvrelay.Client("redis://localhost:1/0", stream_timeout=math.nan)
