"""The PNG written beside a benchmark's JSON: throughput and latency percentiles per system.

Benchmarks name their numbers the serving world's way, and the chart reads them by name:
``*_per_s``, ``*_tok_s`` and ``*throughput*`` are throughputs;
``<metric>_<p50|p90|p99|mean|median|max>_<ms|s>`` are latencies (drawn in ms). A result
holds one system (its top level) or several under ``"systems"`` (a mapping of name to
numbers, or a list) or ``"results"`` (a list); list items are named by ``name`` or
``system``. Numbers may sit one level down (``{"latency": {"ttft_p50_ms": ...}}``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvrelay.cli.errors import CliError

_LATENCY = re.compile(r"^(?P<metric>.+?)_(?P<stat>p\d+(?:\.\d+)?|mean|median|max)_(?P<unit>ms|s)$")
_THROUGHPUT = re.compile(r"(_per_s|_per_sec|_per_second|_tok_s|_req_s)$|throughput")


@dataclass
class SystemResult:
    name: str
    throughput: dict[str, float] = field(default_factory=dict)
    # metric -> statistic -> milliseconds
    latency: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.throughput and not self.latency


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """Numeric leaves of ``metrics`` and of the dictionaries directly inside it."""
    found: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            found[key] = float(value)
        elif isinstance(value, dict):
            for inner, number in value.items():
                if isinstance(number, int | float) and not isinstance(number, bool):
                    found.setdefault(inner, float(number))
    return found


def system_result(name: str, metrics: dict[str, Any]) -> SystemResult:
    result = SystemResult(name)
    for key, value in _numbers(metrics).items():
        match = _LATENCY.match(key)
        if match:
            scale = 1000.0 if match["unit"] == "s" else 1.0
            result.latency.setdefault(match["metric"], {})[match["stat"]] = value * scale
        elif _THROUGHPUT.search(key):
            result.throughput[key] = value
    return result


def extract_systems(data: Any, default_name: str) -> list[SystemResult]:
    """Every system in a benchmark's JSON (see the module's docstring for the shapes)."""
    if not isinstance(data, dict):
        raise CliError(f"{default_name}: expected a JSON object at the top level")
    systems = data.get("systems")
    if systems is None and isinstance(data.get("results"), list):
        systems = data["results"]
    pairs: list[tuple[str, dict[str, Any]]]
    if isinstance(systems, dict):
        pairs = [(str(k), v) for k, v in systems.items() if isinstance(v, dict)]
    elif isinstance(systems, list):
        pairs = [
            (str(row.get("name") or row.get("system") or f"system {i + 1}"), row)
            for i, row in enumerate(systems)
            if isinstance(row, dict)
        ]
    else:
        pairs = [(str(data.get("name") or data.get("system") or default_name), data)]
    results = [system_result(name, metrics) for name, metrics in pairs]
    return [result for result in results if not result.empty]


def render(systems: list[SystemResult], out: Path, title: str) -> Path:
    """Draw the chart into ``out`` (PNG)."""
    if not systems:
        raise CliError(f"{title}: no throughput (*_per_s) or latency (*_p50_ms) numbers to chart")
    try:
        import matplotlib
    except ImportError:
        raise CliError("charts need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput_keys = sorted({k for s in systems for k in s.throughput})
    latency_keys = sorted(
        {(m, st) for s in systems for m, stats in s.latency.items() for st in stats},
        key=lambda pair: (pair[0], _stat_order(pair[1])),
    )
    panels = (["throughput"] if throughput_keys else []) + (["latency"] if latency_keys else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "throughput":
            labels = [k.replace("_", " ") for k in throughput_keys]
            values = [[s.throughput.get(k, 0.0) for k in throughput_keys] for s in systems]
            _bars(ax, labels, values, systems, "per second", "Throughput (higher is better)")
        else:
            labels = [f"{m} {st}" for m, st in latency_keys]
            values = [
                [s.latency.get(m, {}).get(st, 0.0) for m, st in latency_keys] for s in systems
            ]
            _bars(ax, labels, values, systems, "milliseconds", "Latency (lower is better)")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _stat_order(stat: str) -> float:
    if stat.startswith("p"):
        return float(stat[1:])
    return {"mean": -2.0, "median": -1.0, "max": 1000.0}.get(stat, 0.0)


def _bars(
    ax: Any,
    labels: list[str],
    values: list[list[float]],
    systems: list[SystemResult],
    unit: str,
    title: str,
) -> None:
    width = 0.8 / len(systems)
    for i, (system, row) in enumerate(zip(systems, values, strict=True)):
        positions = [x + (i - (len(systems) - 1) / 2) * width for x in range(len(labels))]
        bars = ax.bar(positions, row, width, label=system.name)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if len(systems) > 1:
        ax.legend()


def chart_file(json_path: Path) -> Path:
    """Read a result file and write ``<same name>.png`` beside it."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read benchmark result {json_path}: {exc}") from None
    systems = extract_systems(data, json_path.stem)
    return render(systems, json_path.with_suffix(".png"), json_path.stem.replace("_", " "))
