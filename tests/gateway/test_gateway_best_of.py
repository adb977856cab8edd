"""``best_of`` on the OpenAI gateway: served by /v1/completions, a 400 on chat completions.

A real ``kvrelay gateway`` process in front of a worker on the tiny random model, spoken
to with the ``openai`` client.
"""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from openai import OpenAI

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
PROMPT = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77]


def test_completions_best_of_returns_the_most_likely_candidate(tiny_api: OpenAI) -> None:
    sampled: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0,
               "seed": 3}
    twin = tiny_api.completions.create(n=3, logprobs=0, **sampled)
    scores = []
    for choice in twin.choices:
        assert choice.logprobs is not None
        assert choice.logprobs.token_logprobs is not None
        scores.append(math.fsum(choice.logprobs.token_logprobs))
    best = twin.choices[scores.index(max(scores))].text

    done = tiny_api.completions.create(best_of=3, **sampled)
    assert [(c.index, c.text) for c in done.choices] == [(0, best)]
    assert done.usage is not None
    assert done.usage.completion_tokens == 3 * 6  # every candidate was generated

    chunks = list(tiny_api.completions.create(best_of=3, stream=True,
                                         **sampled))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == best


def test_best_of_below_n_and_on_chat_completions_is_a_400(tiny_api: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"best_of \(1\) must be at least n \(2\)"):
        tiny_api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, n=2, best_of=1)
    with pytest.raises(openai.BadRequestError) as refused:
        tiny_api.chat.completions.create(model=MODEL, max_tokens=2, extra_body={"best_of": 2},
                                    messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == "best_of"
    assert body["code"] == "invalid_request"
