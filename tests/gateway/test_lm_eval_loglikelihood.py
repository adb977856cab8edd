"""lm-evaluation-harness, run in-process against a real gateway and a real worker serving
SmolLM2 in float32: its ``local-completions`` model scores a small multiple-choice task
(a local YAML over a local JSON file, nothing downloaded) through ``echo`` + ``logprobs``,
and every per-sample log-likelihood and greedy flag equals what transformers' float32
log-probabilities give for the same tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.float32_smollm2 import MODEL, float32_smollm2_worker
from helpers.gateway_process import GatewayProcess
from helpers.hf_prompt_scores import TOLERANCE, hf_log_softmax
from helpers.hf_reference import load_hf_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASK = "kvrelay_local_choice"
DOCS = [
    {"question": "Question: What is the capital of France?\nAnswer:",
     "choices": ["Paris", "Berlin", "Madrid"], "answer": 0},
    {"question": "Question: Which animal says moo?\nAnswer:",
     "choices": ["a cow", "a cat", "a duck"], "answer": 0},
    {"question": "Question: Wie heißt die Hauptstadt Japans?\nAntwort:",
     "choices": ["Tōkyō", "Ōsaka", "東京"], "answer": 0},
]
TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def completions_url(redis_url: str, smollm2_folder: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("lm-eval")
    with float32_smollm2_worker(redis_url, smollm2_folder, logs, db=15) as (url, _):
        gateway = GatewayProcess(url, logs).start()
        try:
            yield f"{gateway.url}/v1/completions"
        finally:
            gateway.stop()


def write_task(folder: Path) -> Path:
    folder.mkdir()
    data = folder / "docs.json"
    data.write_text(json.dumps(DOCS, ensure_ascii=False), encoding="utf-8")
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data),
                                         encoding="utf-8")
    return folder


def test_lm_eval_loglikelihoods_equal_transformers(
        completions_url: str, smollm2_folder: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(base_url=completions_url, model=MODEL,
                             tokenizer=str(smollm2_folder), tokenizer_backend="huggingface",
                             tokenized_requests=True, max_length=512, max_retries=1,
                             timeout=120)
    # Only the local task: indexing lm-eval's thousands of built-in ones takes ~20 s.
    tasks = TaskManager(include_path=str(write_task(tmp_path / "tasks")),
                        include_defaults=False)
    results = simple_evaluate(model=lm, tasks=[TASK], task_manager=tasks, num_fewshot=0,
                              log_samples=True, bootstrap_iters=0)
    assert results is not None
    samples: list[dict[str, Any]] = results["samples"][TASK]
    assert len(samples) == len(DOCS)

    hf = load_hf_model(smollm2_folder)
    correct = 0
    for sample in samples:
        expected: list[float] = []
        for (context, continuation), resps in zip(sample["arguments"], sample["resps"],
                                                  strict=True):
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            reference = hf_log_softmax(hf, context_ids + continuation_ids)
            rows = reference[len(context_ids) - 1 : -1]
            value = sum(float(row[t]) for row, t in zip(rows, continuation_ids, strict=True))
            greedy = all(int(row.argmax()) == t
                         for row, t in zip(rows, continuation_ids, strict=True))
            ((loglikelihood, is_greedy),) = resps
            assert abs(loglikelihood - value) <= TOLERANCE * len(continuation_ids), (
                context, continuation, loglikelihood, value)
            assert is_greedy == greedy
            expected.append(value)
        correct += int(max(range(len(expected)), key=expected.__getitem__) == sample["target"])
    assert results["results"][TASK]["acc,none"] == pytest.approx(correct / len(DOCS))
