"""``/v1/completions`` with ``echo`` and ``logprobs``, through the official ``openai``
package, a real gateway and a real worker serving SmolLM2 in float32: every prompt
token's logprob (and its top alternative) equals transformers' float32 log_softmax within
1e-4, with ``max_tokens`` 0 and as lm-evaluation-harness asks (``max_tokens`` 1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.float32_smollm2 import MODEL, float32_smollm2_worker
from helpers.gateway_process import GatewayProcess
from helpers.hf_prompt_scores import TOLERANCE, hf_log_softmax
from helpers.hf_reference import load_hf_model
from openai import OpenAI
from transformers import AutoTokenizer, PreTrainedModel

from kvrelay_worker.engine.sample.token_bytes import TokenBytes, token_bytes_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXT = "Le café coûte 3 € — 東京 is far away, said the naïve fox to the crow."


@pytest.fixture(scope="module")
def client(redis_url: str, smollm2_folder: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    logs = tmp_path_factory.mktemp("echo-logprobs")
    with float32_smollm2_worker(redis_url, smollm2_folder, logs, db=14) as (url, _):
        gateway = GatewayProcess(url, logs).start()
        try:
            with OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                        timeout=120) as openai:
                yield openai
        finally:
            gateway.stop()


@pytest.fixture(scope="module")
def hf(smollm2_folder: Path) -> PreTrainedModel:
    return load_hf_model(smollm2_folder)


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(smollm2_folder))


def check_scored_prompt(logprobs: Any, ids: list[int], reference: torch.Tensor,
                        names: TokenBytes) -> None:
    """OpenAI's parallel lists for the prompt: null first, then each token's logprob and
    its top alternative ({text: logprob}), as transformers computes them."""
    assert logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    for i in range(1, len(ids)):
        row = reference[i - 1]
        value = logprobs.token_logprobs[i]
        assert abs(value - float(row[ids[i]])) <= TOLERANCE, (i, value, float(row[ids[i]]))
        ((text, best),) = logprobs.top_logprobs[i].items()
        top = int(row.argmax())
        assert abs(best - float(row[top])) <= TOLERANCE
        assert text == names(top).decode("utf-8", "replace")
        if top == ids[i]:  # lm-eval's greedy test compares these two values exactly
            assert value == best
        assert logprobs.tokens[i] == names(ids[i]).decode("utf-8", "replace")


def test_echo_with_max_tokens_zero_scores_the_whole_prompt(
        client: OpenAI, hf: PreTrainedModel, tokenizer: Any) -> None:
    ids = list(tokenizer.encode(TEXT))
    done = client.completions.create(model=MODEL, prompt=TEXT, echo=True, logprobs=1,
                                     max_tokens=0, temperature=0)
    (choice,) = done.choices
    assert choice.text == TEXT
    assert choice.finish_reason == "length"
    assert done.usage is not None
    assert done.usage.completion_tokens == 0
    assert choice.logprobs is not None
    assert len(choice.logprobs.token_logprobs or []) == len(ids)
    check_scored_prompt(choice.logprobs, ids, hf_log_softmax(hf, ids),
                        token_bytes_for(tokenizer))


def test_echo_as_lm_eval_sends_it_scores_the_prompt_and_one_token(
        client: OpenAI, hf: PreTrainedModel, tokenizer: Any) -> None:
    """Token ids, ``max_tokens`` 1, ``logprobs`` 1, ``echo``: lm-evaluation-harness's
    loglikelihood request (``local-completions``)."""
    ids = list(tokenizer.encode("The capital of France is Paris, and the capital of "
                                "Japan is Tokyo."))
    done = client.completions.create(model=MODEL, prompt=[ids], echo=True, logprobs=1,
                                     max_tokens=1, temperature=0, seed=1234)
    (choice,) = done.choices
    logprobs = choice.logprobs
    assert logprobs is not None
    assert len(logprobs.token_logprobs or []) == len(ids) + 1
    names = token_bytes_for(tokenizer)
    reference = hf_log_softmax(hf, ids)
    check_scored_prompt(logprobs, ids, reference, names)
    # The generated token: greedy, so transformers' argmax after the whole prompt.
    last = reference[-1]
    top = int(last.argmax())
    tokens, values, tops = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs
    assert tokens is not None
    assert values is not None
    assert tops is not None
    assert tokens[-1] == names(top).decode("utf-8", "replace")
    assert abs(values[-1] - float(last[top])) <= TOLERANCE
    assert values[-1] == max(tops[-1].values())
    assert done.usage is not None
    assert done.usage.completion_tokens == 1
    assert done.usage.prompt_tokens == len(ids)
