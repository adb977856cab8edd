"""Speculation keeps the target's output distribution (temperature 1, with and without
top-k/top-p).

A tiny random model (six-token vocabulary; two layers of width 64, so 20,000 samples
take seconds) samples four tokens after a fixed prompt,
20,000 times per configuration, with speculation off and with each proposer verifying
every proposal: n-gram lookup (one-token n-grams, so nearly every step proposes), a poor
draft (another random model) and a good one (the target's own weights); with top-k and
top-p as well, the poor draft. The joint
distribution of the four tokens (1,296 outcomes; outcomes expected fewer than five times
pooled) is compared with the off run's by a chi-square test of homogeneity; p > 0.01 is
required. A broken verification (a draft accepted on the wrong row, a rolled-back slot
read again, the bonus token drawn from the wrong distribution) shifts the joint
distribution by far more than 20,000 samples can hide.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.tiny_models import build_tiny_model

from kvrelay_worker import SamplingParams
from kvrelay_worker.engine import LLM, EngineConfig, LLMEngine
from kvrelay_worker.loading import load_model_source
from kvrelay_worker.models.factory import build_model

VOCAB = 6
NEW_TOKENS = 4
SAMPLES = 20_000
PROMPT = [1, 2, 3, 1, 2]
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
SAMPLING = {
    "temperature-1": {"temperature": 1.0},
    "top-k-top-p": {"temperature": 1.0, "top_k": 4, "top_p": 0.8},
}
PROPOSERS = ["ngram", "poor-draft", "good-draft"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, tokenizer_folder: Path
            ) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("spec-distribution")
    with one_torch_thread():
        yield {
            "target": build_tiny_model("llama-mqa", root / "target", tokenizer_folder,
                                       vocab_size=VOCAB, seed=0, **SMALL),
            "poor": build_tiny_model("llama-mqa", root / "poor", tokenizer_folder,
                                     vocab_size=VOCAB, seed=7, **SMALL),
        }


def _model(folder: Path) -> Any:
    files = load_model_source(str(folder))
    return build_model(files.config, files.weights(), torch.float32, torch.device("cpu"),
                       max_position=files.config.max_position_embeddings), files.tokenizer


def _samples(folders: dict[str, Path], proposer: str | None, sampling: dict[str, Any]
             ) -> tuple[Counter[tuple[int, ...]], dict[str, Any]]:
    model, tokenizer = _model(folders["target"])
    options: dict[str, Any] = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                               "num_kv_blocks": 2048, "seed": 1 if proposer else 2}
    draft = None
    if proposer is not None:
        options |= {"speculative_adaptive": False, "speculative_ngram_min": 1,
                    "speculative": "ngram" if proposer == "ngram" else "draft:tiny"}
        if proposer != "ngram":
            draft, _ = _model(folders["poor" if proposer == "poor-draft" else "target"])
    config = EngineConfig(model="tiny", device="cpu", dtype="float32", **options)
    engine = LLMEngine.from_model(config, model, tokenizer, model_id="tiny",
                                  draft_model=draft)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, **sampling)
    outputs = LLM.from_engine(engine).generate([PROMPT] * SAMPLES, params)
    counts = Counter(tuple(out.token_ids) for out in outputs)
    return counts, engine.stats()


def chi_square_p(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]]) -> float:
    """p-value of the chi-square test that ``a`` and ``b`` come from one distribution."""
    total_a, total_b = sum(a.values()), sum(b.values())
    total = total_a + total_b
    table: list[tuple[int, int]] = []
    pooled = [0, 0]
    for key in set(a) | set(b):
        row = (a[key], b[key])
        if min(sum(row) * total_a, sum(row) * total_b) / total < 5:
            pooled = [pooled[0] + row[0], pooled[1] + row[1]]
        else:
            table.append(row)
    if sum(pooled):
        table.append((pooled[0], pooled[1]))
    stat = 0.0
    for x, y in table:
        n = x + y
        for observed, column in ((x, total_a), (y, total_b)):
            expected = n * column / total
            stat += (observed - expected) ** 2 / expected
    dof = len(table) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


_off: dict[str, Counter[tuple[int, ...]]] = {}


# Every proposer at temperature 1; with top-k/top-p the poor draft, whose many rejections
# make the most draws from the processed residual distribution.
CASES = [(proposer, "temperature-1") for proposer in PROPOSERS] + [("poor-draft", "top-k-top-p")]


@pytest.mark.slow
@pytest.mark.parametrize(("proposer", "sampling"), CASES, ids=[f"{p}-{s}" for p, s in CASES])
def test_speculation_keeps_the_distribution(folders: dict[str, Path], proposer: str,
                                            sampling: str) -> None:
    if sampling not in _off:
        _off[sampling], _ = _samples(folders, None, SAMPLING[sampling])
    on, stats = _samples(folders, proposer, SAMPLING[sampling])
    assert stats["spec_verify_steps"] >= SAMPLES, "most sequences must have speculated"
    if proposer == "good-draft":
        assert stats["spec_acceptance_rate"] > 0.3
    if proposer == "poor-draft":
        assert stats["spec_accepted_tokens"] < stats["spec_proposed_tokens"]
    p = chi_square_p(_off[sampling], on)
    assert p > 0.01, f"{proposer}: joint distribution differs (p = {p:.2e}), {stats}"


def test_chi_square_tells_distributions_apart() -> None:
    """The test above can fail: a shifted distribution gets a tiny p-value."""
    generator = torch.Generator().manual_seed(0)
    fair = torch.randint(0, 6, (20_000,), generator=generator).tolist()
    loaded = torch.multinomial(torch.tensor([0.2, 0.16, 0.16, 0.16, 0.16, 0.16]), 20_000,
                               replacement=True, generator=generator).tolist()
    same = torch.randint(0, 6, (20_000,), generator=generator).tolist()
    as_counter = lambda xs: Counter((x,) for x in xs)  # noqa: E731
    assert chi_square_p(as_counter(fair), as_counter(loaded)) < 1e-6
    assert chi_square_p(as_counter(fair), as_counter(same)) > 0.01
