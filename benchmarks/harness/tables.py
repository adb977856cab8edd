"""The docs' performance tables and quoted figures, generated from stored results.

A figure is one number read from one result file in ``benchmarks/measured/``. A page
quotes it as ``<!-- figure: NAME -->VALUE``; a generated table sits between
``<!-- table: NAME -->`` and ``<!-- /table -->``. ``python benchmarks/tables.py``
rewrites both from the files; ``--check`` only reports what differs (the tests run it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.machine import REPOSITORY
from harness.results import read_result

MEASURED = REPOSITORY / "benchmarks" / "measured"
# The pages whose tables and figures are generated (history is not: it keeps old values).
PAGES = ("README.md", "docs/*.md", "benchmarks/README.md")

# A figure is digits (with , and .) and an optional × or %; a unit follows it as text.
FIGURE = re.compile(r"<!-- figure: (?P<name>[\w.-]+) -->(?P<value>\d(?:[\d.,]*\d)?[×%]?)")
TABLE = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)

Step = str | int | tuple[str, Any]  # a key, a list index, or (key, value) picking a list item


@dataclass(frozen=True)
class Figure:
    """One number of one result file, formatted as the pages print it."""

    file: str
    path: tuple[Step, ...]
    fmt: Callable[[float], str]

    def value(self, measured: Path | None = None) -> str:
        node: Any = read_result((measured or MEASURED) / self.file)
        for step in self.path:
            if isinstance(step, tuple):
                key, wanted = step
                node = next(item for item in node if item.get(key) == wanted)
            else:
                node = node[step]
        return self.fmt(float(node))


def times(digits: int) -> Callable[[float], str]:
    return lambda x: f"{x:.{digits}f}×"


def number(digits: int) -> Callable[[float], str]:
    return lambda x: f"{x:,.{digits}f}"


FIGURES: dict[str, Figure] = {
    "offline-vs-hf": Figure("cpu-offline.json", ("summary", "kvrelay_vs_best_hf"), times(2)),
    "offline-tok-s": Figure("cpu-offline.json", ("results", ("system", "kvrelay"),
                                                 "output_tok_s"), number(1)),
    "serve-ratio": Figure("cpu-serve.json", ("throughput_ratio",), times(2)),
    "pickup-p50": Figure("cpu-serve.json", ("idle_ttft_ms", "enqueue_to_pickup", "p50"),
                         number(1)),
    "long-context-vs-hf": Figure("cpu-long-context.json",
                                 ("throughput", "summary", "kvrelay_vs_best_hf"), times(2)),
    "spec-grounded": Figure("cpu-speculative.json", ("rows", ("row", "grounded-b1"), "speedup"),
                            times(2)),
    "redis-commands-per-token": Figure("cpu-scaling-16-release-in-batch-run1.json",
                                       ("results", 0, "redis_commands_per_token"), number(2)),
    "redis-cpu-us-per-token": Figure("cpu-scaling-16-release-in-batch-run1.json",
                                     ("results", 0, "redis_cpu_us_per_token"), number(1)),
    "gpus-per-redis": Figure("cpu-scaling-16-release-in-batch-run1.json",
                             ("projection", "gpus_per_redis_at_70pct_core"), number(0)),
    "streams-stall-max": Figure("cpu-client-streams-real.json", ("stall_max_ms",),
                                number(0)),
    "gateway-ttft-added": Figure("cpu-gateway.json", ("ttft_added_p50_ms",), number(1)),
    "h200-decode-b64": Figure("h200-decode-step.json",
                              ("decode_step", ("batch", 64), "tokens_per_s"), number(0)),
    "h200-decode-b1": Figure("h200-decode-step.json",
                             ("decode_step", ("batch", 1), "tokens_per_s"), number(0)),
    "cpu-q4-decode-vs-llamacpp": Figure(
        "cpu-vs-llamacpp.json",
        ("ratios", ("pair", "kvrelay gguf-kept (Q4_1) / llama.cpp (no-amx)"), "decode_1"),
        times(2)),
    "cpu-q4-total32-vs-llamacpp": Figure(
        "cpu-vs-llamacpp.json",
        ("ratios", ("pair", "kvrelay gguf-kept (Q4_1) / llama.cpp (no-amx)"), "total_32"),
        times(2)),
    "cpu-q4-decode-vs-llamacpp-avx2": Figure(
        "cpu-vs-llamacpp-avx2.json",
        ("ratios", ("pair", "kvrelay gguf-kept (Q4_1) (in-process) / llama.cpp (native)"),
         "decode_1"), times(2)),
    "cpu-q4-pp512-vs-llamacpp-avx2": Figure(
        "cpu-vs-llamacpp-avx2.json",
        ("ratios", ("pair", "kvrelay gguf-kept (Q4_1) (in-process) / llama.cpp (native)"),
         "pp_512"), times(2)),
    "cpu-q4-total32-vs-llamacpp-avx2": Figure(
        "cpu-vs-llamacpp-avx2.json",
        ("ratios", ("pair", "kvrelay gguf-kept (Q4_1) (in-process) / llama.cpp (native)"),
         "total_32"), times(2)),
    "cpu-int8-decode-vs-float32": Figure(
        "cpu-vs-llamacpp.json", ("ratios", ("pair", "kvrelay int8 / kvrelay float32"),
                                 "decode_1"), times(2)),
    "cpu-q4-decode-tok-s": Figure(
        "cpu-vs-llamacpp.json", ("rows", ("system", "kvrelay gguf-kept (Q4_1)"), "decode_1"),
        number(1)),
    "structured-cost": Figure("cpu-structured-tiny.json", ("cost",),
                              lambda x: f"{100 * x:.1f}%"),
}

# The README's table: what, its one figure and the figure's unit, the benchmark.
PERFORMANCE = (
    ("Offline throughput, SmolLM2, 64 requests, against the best Hugging Face baseline",
     "offline-vs-hf", "", "offline.py"),
    ("Serving through Redis + Celery against in-process, same workload", "serve-ratio", "",
     "serve.py"),
    ("16 long prompts (2k-6k tokens) against static `generate`", "long-context-vs-hf", "",
     "long_context.py"),
    ("Speculative decoding (n-gram), grounded prompts, batch 1", "spec-grounded", "",
     "speculative.py"),
    ("1,000 concurrent streams from one client: longest event-loop stall",
     "streams-stall-max", " ms", "client_streams.py"),
    ("CPU decode at batch 1, the Q4_1 GGUF kept, against llama.cpp (AVX2, same file)",
     "cpu-q4-decode-vs-llamacpp-avx2", "", "vs_llamacpp.py"),
    ("CPU throughput, 32 sequences x (128 + 128 tokens), Q4_1 kept, against llama.cpp "
     "(AVX2)", "cpu-q4-total32-vs-llamacpp-avx2", "", "vs_llamacpp.py"),
    ("Decode step, Llama-3-8B shape, batch 64, H200", "h200-decode-b64", " tok/s",
     "gpu_kernels.py"),
)


def performance_table() -> str:
    lines = ["| what | measured | benchmark |", "|---|---|---|"]
    for what, name, unit, script in PERFORMANCE:
        value = FIGURES[name].value()
        lines.append(f"| {what} | **<!-- figure: {name} -->{value}{unit}** | `{script}` |")
    return "\n".join(lines) + "\n"


def latest_result(benchmark: str, measured: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest stored result of ``benchmark`` (by its envelope's date), if any."""
    found = [(path, read_result(path)) for path in sorted((measured or MEASURED).glob("*.json"))]
    mine = [(path, record) for path, record in found if record["benchmark"] == benchmark]
    return max(mine, key=lambda pair: pair[1]["date"]) if mine else None


def _leaves(node: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    """Numbers and booleans of a result, two levels deep, dotted names (lists left out)."""
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool | int | float):
            out.append((name, value))
        elif isinstance(value, dict) and depth < 2:
            out.extend(_leaves(value, name + ".", depth + 1))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, bool | int):
        return str(value)
    return f"{value:.4g}"


MAX_ROWS = 16


# Inputs rather than results: left out of the latest-result tables.
_INPUTS = {"workload", "engine_options", "environment", "versions", "cases", "jobs", "config",
           "prompts", "continuation", "model"}
MAX_COLUMNS = 8


def _row_table(rows: list[dict[str, Any]]) -> list[str]:
    columns = [k for k, v in rows[0].items()
               if isinstance(v, str | int | float | bool) or v is None][:MAX_COLUMNS]
    lines = ["| " + " | ".join(f"`{c}`" for c in columns) + " |",
             "|" + "---|" * len(columns)]
    for row in rows[:MAX_ROWS]:
        cells = [row.get(c) for c in columns]
        lines.append("| " + " | ".join("" if v is None else
                                      (v if isinstance(v, str) else _shown(v)) for v in cells)
                     + " |")
    return lines


def latest_table(benchmark: str) -> str:
    """The newest stored result's figures, for ``benchmarks/README.md``: its first list of
    rows as a table, else its numbers by name."""
    latest = latest_result(benchmark)
    if latest is None:
        return "No stored result yet: run it and keep the JSON in `benchmarks/measured/`.\n"
    return result_table(*latest)


def file_table(name: str) -> str:
    """The same for one stored file (a run of a benchmark on another workload, kept beside
    its default run: ``<!-- table: file-NAME -->`` for ``measured/NAME.json``)."""
    path = MEASURED / f"{name}.json"
    if not path.exists():
        return f"No stored result `measured/{name}.json` yet.\n"
    return result_table(path, read_result(path))


def result_table(path: Path, record: dict[str, Any]) -> str:
    figures = {k: v for k, v in record.items()
               if k not in ("benchmark", "args", "commit", "machine", "date", *_INPUTS)}
    lines = [f"`measured/{path.name}`, {record['date'][:10]}:", ""]
    lists = [v for v in figures.values()
             if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
    if lists:
        return "\n".join(lines + _row_table(lists[0])) + "\n"
    leaves = _leaves(figures)
    lines += ["| figure | value |", "|---|---|"]
    lines += [f"| `{name}` | {_shown(value)} |" for name, value in leaves[:MAX_ROWS]]
    if len(leaves) > MAX_ROWS:
        lines.append(f"| ({len(leaves) - MAX_ROWS} more in the file) | |")
    return "\n".join(lines) + "\n"


class _Tables(dict[str, Callable[[], str]]):
    """The named tables; ``bench-NAME`` is benchmark NAME's latest result, ``file-NAME``
    the stored result ``measured/NAME.json``."""

    def __missing__(self, name: str) -> Callable[[], str]:
        if name.startswith("file-"):
            return lambda: file_table(name.removeprefix("file-"))
        if name.startswith("bench-"):
            return lambda: latest_table(name.removeprefix("bench-").replace("-", "_"))
        raise KeyError(name)


TABLES = _Tables(performance=performance_table)


def pages(root: Path = REPOSITORY) -> list[Path]:
    return sorted(p for pattern in PAGES for p in root.glob(pattern))


def render(text: str) -> str:
    """``text`` with every generated table and quoted figure as the files say now."""
    def table(match: re.Match[str]) -> str:
        return match.group(1) + TABLES[match["name"]]() + match.group(4)

    def figure(match: re.Match[str]) -> str:
        spec = FIGURES.get(match["name"])
        value = spec.value() if spec else match["value"]
        return f"<!-- figure: {match['name']} -->{value}"

    return FIGURE.sub(figure, TABLE.sub(table, text))


def quoted_figures(files: Iterable[Path]) -> dict[str, dict[str, set[str]]]:
    """``{figure name: {value: {page, ...}}}`` over ``files``."""
    found: dict[str, dict[str, set[str]]] = {}
    for path in files:
        for match in FIGURE.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match["name"], {}).setdefault(match["value"], set()).add(path.name)
    return found


def stale(root: Path = REPOSITORY) -> list[str]:
    """The pages whose tables or figures differ from the result files."""
    return [str(p.relative_to(root)) for p in pages(root)
            if render(text := p.read_text(encoding="utf-8")) != text]


def rewrite(root: Path = REPOSITORY) -> list[str]:
    changed = []
    for path in pages(root):
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(str(path.relative_to(root)))
    return changed
