"""``kvrelay bench``: run benchmarks from the repository's ``benchmarks/`` folder, then
chart each result beside its JSON.

A benchmark is ``benchmarks/NAME.py`` that accepts ``--out PATH`` and writes its JSON
there. Its output goes to ``<results>/NAME.log``; while it runs, the last progress line it
printed (its own tqdm bar, if any) is shown with the elapsed time, and its report is
printed when it ends. A benchmark that draws its own ``NAME.png`` keeps it; for the others
the generic chart (throughput and latency percentiles per system) is drawn there.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

import click

from kvrelay.cli import processes
from kvrelay.cli.bench_chart import chart_file
from kvrelay.cli.errors import CliError, require_worker_package
from kvrelay.cli.progress import Spinner
from kvrelay.cli.signals import interrupts_held

DEFAULT_BENCHMARKS = ("offline",)
# A tqdm progress line ("45%|####    | 45/100 [...]"): not part of a benchmark's report.
_TQDM_BAR = re.compile(r"\d+%\|")


def available(folder: Path) -> list[str]:
    """The benchmarks in ``folder``: scripts that take ``--out`` (the contract above);
    helper modules beside them are not benchmarks."""
    return sorted(p.stem for p in folder.glob("*.py") if _is_benchmark(p))


def _is_benchmark(script: Path) -> bool:
    if script.name.startswith("_"):
        return False
    text = script.read_text(encoding="utf-8", errors="replace")
    return '"--out"' in text


def _last_progress(log: Path, width: int = 70) -> str:
    """The last line (or carriage-return segment) a child wrote: its current progress."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 2048))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    segments = [s.strip() for s in tail.replace("\r", "\n").split("\n") if s.strip()]
    return segments[-1][:width] if segments else ""


def run_one(script: Path, out: Path, extra: list[str], position: str) -> float:
    """Run one benchmark to completion; its wall time."""
    log = out.with_suffix(".log")
    log.unlink(missing_ok=True)
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(script), "--out", str(out), *extra]
    label = f"Benchmark {script.stem} {position}"
    spinner = Spinner(label)
    process = processes.spawn(argv, log=log, cwd=script.parent.parent)
    try:
        while process.poll() is None:
            progress = _last_progress(log)
            spinner.tick(f"{label}: {progress}" if progress and spinner.live else label)
            time.sleep(0.1)
    finally:
        with interrupts_held():
            processes.stop(process, grace=5.0)
    elapsed = spinner.elapsed
    if process.returncode != 0:
        raise CliError(
            f"benchmark {script.stem} failed with status {process.returncode}; "
            f"last output: {_last_progress(log, 300)}; full log: {log}"
        )
    if not out.is_file():
        raise CliError(
            f"benchmark {script.stem} wrote no JSON at {out} (a benchmark must accept --out PATH)"
        )
    spinner.done(f"Benchmark {script.stem} done in {elapsed:.1f}s: {out}")
    return elapsed


@click.command("bench")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option(
    "--benchmarks-dir",
    type=click.Path(path_type=Path),
    default=Path("benchmarks"),
    show_default=True,
    help="Folder holding the benchmark scripts.",
)
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path),
    help="Where JSON, logs and charts go [default: <benchmarks-dir>/results].",
)
@click.option(
    "--args",
    "extra",
    metavar="ARGS",
    default="",
    help="Extra arguments for every benchmark, as one shell-quoted string.",
)
@click.option(
    "--chart",
    "chart_only",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Only draw the chart of an existing JSON result.",
)
@click.option("--list", "list_only", is_flag=True, help="List the benchmarks and exit.")
def bench(
    names: tuple[str, ...],
    benchmarks_dir: Path,
    results_dir: Path | None,
    extra: str,
    chart_only: Path | None,
    list_only: bool,
) -> None:
    """Run benchmarks (default: offline) and write NAME.json and NAME.png for each."""
    if chart_only is not None:
        if not chart_only.is_file():
            raise CliError(f"no such file: {chart_only}")
        click.echo(f"Chart: {chart_file(chart_only)}")
        return
    if not benchmarks_dir.is_dir():
        raise CliError(
            f"no benchmarks folder at {benchmarks_dir}: run from the kvrelay "
            "repository or pass --benchmarks-dir"
        )
    known = available(benchmarks_dir)
    if list_only:
        click.echo("\n".join(known))
        return
    chosen = list(names) or list(DEFAULT_BENCHMARKS)
    missing = [name for name in chosen if name not in known]
    if missing:
        raise CliError(
            f"no benchmark named {', '.join(missing)} in {benchmarks_dir} "
            f"(available: {', '.join(known) or 'none'})"
        )
    require_worker_package("kvrelay bench")
    try:
        extra_args = shlex.split(extra)
    except ValueError as exc:
        raise CliError(f"--args: {exc}") from None
    results = (results_dir or benchmarks_dir / "results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(chosen, start=1):
        out = results / f"{name}.json"
        started = time.time()
        run_one(
            (benchmarks_dir / f"{name}.py").resolve(), out, extra_args, f"({index}/{len(chosen)})"
        )
        report = _report_of(out.with_suffix(".log"))
        if report:
            click.echo(report)
        png = out.with_suffix(".png")
        if png.is_file() and png.stat().st_mtime >= started:
            click.echo(f"Chart: {png} (drawn by the benchmark)")
        else:
            click.echo(f"Chart: {chart_file(out)}")


def _report_of(log: Path) -> str:
    """What the benchmark printed, without its progress bars."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    lines = [raw.split("\r")[-1].rstrip() for raw in text.split("\n")]
    return "\n".join(line for line in lines if not _TQDM_BAR.search(line)).strip()
