"""``benchmarks/offline.py --quick`` end to end on a tiny random model.

The benchmark is run by hand and rarely; this keeps it from rotting between runs: every
system still loads, generates the requested token counts, agrees with the others on greedy
tokens, and the JSON and PNG come out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from helpers.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark() -> ModuleType:
    return load_benchmark("offline")


@pytest.mark.slow
def test_quick_offline_benchmark_reports_three_systems(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    offline = _load_benchmark()
    out = tmp_path / "offline.json"
    model = tiny_model("llama-mqa")

    assert offline.main(["--quick", "--model", str(model), "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    results = {r["system"]: r for r in report["results"]}
    assert set(results) == {"kvrelay", "hf-continuous", "hf-static"}
    for name, result in results.items():
        assert result["error"] is None, f"{name}: {result['error']}"
        assert result["output_tok_s"] > 0, name
        assert result["output_tokens"] == report["workload"]["total_output_tokens"]
        assert result["produced_tokens_ok"] is True, name
    assert report["summary"]["kvrelay_vs_best_hf"] > 0
    assert report["machine"]["torch_threads"] >= 1
    # The tiny model's logits are well separated: greedy tokens must agree everywhere.
    for pair, check in report["agreement"].items():
        assert check["identical"] == check["requests"], pair
    assert out.with_suffix(".png").stat().st_size > 0
