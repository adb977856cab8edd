"""``kvrelay bench``: runs benchmark scripts, shows their report, charts each result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import cli_env, one_line_error, run_cli
from click.testing import CliRunner

from kvrelay.cli.bench_chart import extract_systems
from kvrelay.cli.main import cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

FAKE_BENCHMARK = """
import argparse, json, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()
for i in range(3):
    sys.stderr.write(f"\\rstep: {33 * (i + 1)}%|###| {i + 1}/3")
    sys.stderr.flush()
    time.sleep(0.05)
if args.fail:
    sys.exit("it broke")
print("system   tok/s")
print("kvrelay  120.0")
result = {"systems": {
    "kvrelay": {"output_tokens_per_s": 120.0, "ttft_p50_ms": 20, "ttft_p99_ms": 45},
    "baseline": {"output_tokens_per_s": 60.0, "ttft_p50_ms": 35, "ttft_p99_ms": 80},
}}
open(args.out, "w").write(json.dumps(result))
"""


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "fake.py").write_text(FAKE_BENCHMARK)
    return folder


def test_runs_reports_and_charts(tmp_path: Path, bench_dir: Path) -> None:
    result = run_cli(["bench", "fake", "--benchmarks-dir", str(bench_dir)], cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "kvrelay  120.0" in result.stdout
    assert "step:" not in result.stdout  # progress lines are not part of the report
    assert "Benchmark fake done in" in result.stderr
    results = bench_dir / "results"
    assert json.loads((results / "fake.json").read_text())["systems"]["kvrelay"]
    assert (results / "fake.png").read_bytes().startswith(PNG_SIGNATURE)
    assert f"Chart: {results / 'fake.png'}" in result.stdout


def test_failing_benchmark_is_one_line(tmp_path: Path, bench_dir: Path) -> None:
    args = ["bench", "fake", "--benchmarks-dir", str(bench_dir), "--args", "--fail"]
    result = run_cli(args, cli_env(tmp_path))
    assert result.returncode == 1
    line = one_line_error(result.stderr)
    assert "benchmark fake failed with status 1" in line
    assert "it broke" in line


def test_unknown_benchmark_lists_the_known_ones(bench_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "nope", "--benchmarks-dir", str(bench_dir)])
    assert result.exit_code == 1
    assert "no benchmark named nope" in result.output
    assert "(available: fake)" in result.output


def test_list_shows_benchmarks_not_their_helpers(bench_dir: Path) -> None:
    (bench_dir / "shared_stats.py").write_text("def p50(xs):\n    return sorted(xs)[len(xs) // 2]\n")
    result = CliRunner().invoke(cli, ["bench", "--list", "--benchmarks-dir", str(bench_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["fake"]
    repository = Path(__file__).resolve().parents[2] / "benchmarks"
    listed = CliRunner().invoke(cli, ["bench", "--list", "--benchmarks-dir", str(repository)])
    assert {"offline", "serve", "client_streams"} <= set(listed.output.split())
    assert not {"latency_stats", "tiny_model", "decode_step"} & set(listed.output.split())


def test_chart_only(tmp_path: Path) -> None:
    result_file = tmp_path / "streams.json"
    result_file.write_text(json.dumps({"events_per_s": 26000, "ttft_p50_ms": 600.0,
                                       "stall_p99_ms": 14.6, "streams": 1000}))  # fmt: skip
    result = CliRunner().invoke(cli, ["bench", "--chart", str(result_file)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "streams.png").read_bytes().startswith(PNG_SIGNATURE)


def test_chart_without_numbers_is_refused(tmp_path: Path) -> None:
    result_file = tmp_path / "empty.json"
    result_file.write_text(json.dumps({"note": "nothing measured"}))
    result = CliRunner().invoke(cli, ["bench", "--chart", str(result_file)])
    assert result.exit_code == 1
    assert "no throughput" in result.output


def test_reads_the_shapes_benchmarks_write() -> None:
    offline = {"results": [{"system": "kvrelay", "output_tok_s": 300.0, "wall_s": 2.0},
                           {"system": "hf-static", "output_tok_s": 100.0}]}  # fmt: skip
    systems = extract_systems(offline, "offline")
    assert [(s.name, s.throughput) for s in systems] == [
        ("kvrelay", {"output_tok_s": 300.0}),
        ("hf-static", {"output_tok_s": 100.0}),
    ]
    listed = {"systems": [{"name": "a", "latency": {"itl_p90_s": 0.5, "itl_mean_s": 0.25}}]}
    (a,) = extract_systems(listed, "x")
    assert a.latency == {"itl": {"p90": 500.0, "mean": 250.0}}
    flat = extract_systems({"request_throughput": 4.0, "tpot_p99_ms": 31.0}, "flat")
    assert flat[0].name == "flat"
    assert flat[0].throughput == {"request_throughput": 4.0}
    assert flat[0].latency == {"tpot": {"p99": 31.0}}
