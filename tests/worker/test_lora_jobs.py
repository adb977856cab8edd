"""Jobs with a LoRA adapter on real worker processes: loaded at start and at run time,
token-identical to PEFT's merged model in transformers, refused clearly when the worker
does not hold the adapter, and continued token-identically after a worker's death.

The adapters are made by ``peft`` on the tiny random ``llama-mqa`` model
(``helpers.lora_fixtures``); greedy, ignoring EOS, so every run is comparable.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.job_log import read_events, wait_terminal
from helpers.lora_adapters import peft_greedy
from helpers.worker_fixtures import TINY
from helpers.worker_process import WorkerProcess

from kvrelay import Client, InvalidRequest
from kvrelay.protocol import Failed, Finished, Started, Tokens

pytestmark = pytest.mark.integration

PROMPT = [21, 22, 23, 24, 25, 26, 27]
GREEDY = {"prompt_token_ids": PROMPT, "temperature": 0.0, "ignore_eos": True}


def _tokens(client: Client, lora: str | None, max_tokens: int = 12) -> list[int]:
    return client.generate(**GREEDY, max_tokens=max_tokens, lora=lora).token_ids


def test_adapter_loaded_at_start_answers_as_peft_merged(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tiny_model_path: str, lora_adapters: dict[str, Path]) -> None:
    tone, style = lora_adapters["tone"], lora_adapters["style"]
    start_worker("w1", lora_modules=f"tone={tone},style={style}")
    base = Path(tiny_model_path)
    with Client(clean_redis_url, model=TINY) as client:
        (worker,) = client.workers()
        assert {(a.name, a.base) for a in worker.adapters} == {("tone", TINY), ("style", TINY)}
        plain, with_tone, with_style = (_tokens(client, lora) for lora in (None, "tone", "style"))
    assert with_tone == peft_greedy(base, tone, PROMPT, 12)
    assert with_style == peft_greedy(base, style, PROMPT, 12)
    assert plain == peft_greedy(base, None, PROMPT, 12)
    assert len({tuple(plain), tuple(with_tone), tuple(with_style)}) == 3  # adapters matter


def test_adapter_loaded_and_unloaded_at_run_time(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tiny_model_path: str, lora_adapters: dict[str, Path], tmp_path: Path) -> None:
    start_worker("w1", max_loras=1)
    style = lora_adapters["style"]
    with Client(clean_redis_url, model=TINY) as client:
        assert client.adapters.list() == []
        with pytest.raises(InvalidRequest, match="holds adapter 'style'"):
            client.generate(**GREEDY, max_tokens=4, lora="style")  # refused before enqueue
        reports = client.adapters.load("style", str(style))
        assert [r.ok for r in reports.values()] == [True]
        (listed,) = client.adapters.list()
        assert (listed.name, listed.base, listed.path) == ("style", TINY, str(style))
        assert _tokens(client, "style") == peft_greedy(Path(tiny_model_path), style, PROMPT, 12)

        with pytest.raises(InvalidRequest, match="not a PEFT adapter folder"):
            client.adapters.load("broken", str(tmp_path))  # the worker's own refusal
        client.adapters.unload("style")
        assert client.adapters.list() == []
        with pytest.raises(InvalidRequest, match="no live worker holds adapter 'style'"):
            client.adapters.unload("style")
        assert _tokens(client, None, 4)  # the worker runs on


def test_job_naming_an_adapter_the_worker_lacks_fails_invalid_request(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        lora_adapters: dict[str, Path]) -> None:
    worker = start_worker("w1", lora_modules=f"tone={lora_adapters['tone']}")
    # require_worker=False skips the SDK's check, so the worker itself must refuse.
    with Client(clean_redis_url, model=TINY, require_worker=False) as client:
        with client.stream(**GREEDY, max_tokens=4, lora="nope") as stream:
            job_id = stream.job_id
            with pytest.raises(InvalidRequest, match="holds no adapter 'nope'"):
                stream.final()
        assert _tokens(client, "tone", 4)
    failed = wait_terminal(clean_redis_url, job_id)[-1]
    assert isinstance(failed, Failed)
    assert failed.code == "invalid_request"
    assert worker.alive()


def test_adapter_job_survives_its_worker_being_killed(
        start_worker: Callable[..., WorkerProcess], clean_redis_url: str,
        tiny_model_path: str, lora_adapters: dict[str, Path]) -> None:
    tone = lora_adapters["tone"]
    workers = [start_worker(name, concurrency=4, lora_modules=f"tone={tone}")
               for name in ("a", "b")]
    job = {**GREEDY, "max_tokens": 200, "lora": "tone"}
    reference = peft_greedy(Path(tiny_model_path), tone, PROMPT, 200)
    with Client(clean_redis_url, model=TINY) as client:
        seqs: list[int] = []
        with client.stream(**job) as stream:
            for chunk in stream:
                seqs.append(chunk.seq)
                if len(seqs) == 5:
                    started = [e for e in read_events(clean_redis_url, stream.job_id)
                               if isinstance(e, Started)][-1]
                    pid = int(started.worker.rsplit(":", 1)[1])
                    next(w for w in workers if w.pid == pid).kill()
            final = stream.final()
    events = wait_terminal(clean_redis_url, stream.job_id)
    assert [e.attempt for e in events if isinstance(e, Started)] == [1, 2]
    assert isinstance(events[-1], Finished)
    assert [t for e in events if isinstance(e, Tokens) for t in e.token_ids] == reference
    assert final.token_ids == reference
    assert seqs == sorted(set(seqs))
