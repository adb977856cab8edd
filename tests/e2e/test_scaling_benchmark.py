"""``benchmarks/scaling.py`` end to end at a tiny size: real redis-server, real simulated
worker processes, real SDK load generators; the figures and the PNG come out.

Run by hand and rarely at full size; this keeps it from rotting between runs. No timing
is asserted: only that every part measured something and nothing failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark() -> ModuleType:
    return load_benchmark("scaling")


@pytest.mark.slow
def test_tiny_scaling_run_measures_every_size(tmp_path: Path) -> None:
    scaling = _load_benchmark()
    out = tmp_path / "scaling.json"
    assert scaling.main([
        "--sizes", "1,2", "--concurrency", "4", "--time-scale", "1", "--max-tokens", "12",
        "--prompt-tokens", "16", "--load-procs", "1", "--warmup", "2", "--measure", "3",
        "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    rows = report["results"]
    assert [r["workers"] for r in rows] == [1, 2]
    for row in rows:
        assert row["client_errors"] == 0
        assert row["tokens"] > 0
        assert row["jobs_finished_in_window"] > 0
        # Every token costs Redis something: at least the event's publish.
        assert row["redis_commands_per_token"] >= 1
        assert row["commands_per_token_by_name"]["publish"] > 0
        assert row["redis_cpu_us_per_token"] > 0
        assert "info" not in row["commands_per_token_by_name"]
        assert row["pickup_ms"]["p99"] >= row["pickup_ms"]["p50"] > 0
        assert row["itl_ms"]["p50"] > 0
        assert row["cpu_cores"]["workers"] > 0
    projection = report["projection"]
    # From the largest fleet whose batches stayed full (the last one if none did). Which
    # that is depends on how busy the machine was, so the rule is checked, not the size.
    full = [r["workers"] for r in rows if r["occupancy"] >= scaling._FULL_OCCUPANCY]
    assert projection["from_workers"] == (full[-1] if full else rows[-1]["workers"])
    assert projection["redis_cores_needed"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
