"""The synchronous ``Client`` once closed: every call fails with ``KvrelayError``."""

from __future__ import annotations

import pytest

from kvrelay import Client, KvrelayError


def test_calls_after_close_raise_kvrelay_error(clean_redis_url: str) -> None:
    client = Client(clean_redis_url, model="m", require_worker=False)
    with client:
        stream = client.stream(prompt_token_ids=[1, 2], max_tokens=4)  # not started yet
    client.close()  # a second close is a no-op
    with pytest.raises(KvrelayError, match="closed"):
        client.generate(prompt_token_ids=[1, 2], max_tokens=4)
    with pytest.raises(KvrelayError, match="closed"):
        client.stream(prompt_token_ids=[1, 2], max_tokens=4)
    with pytest.raises(KvrelayError, match="closed"):
        next(stream)
    stream.close()  # closing a stream of a closed client does nothing
