"""Summarise ``benchmarks/ab.sh``: mean output tokens/s of each side, and this / base."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from harness import write_result


def rate(result: dict[str, Any], bench: str, path: str) -> float:
    if bench == "engine_overhead":
        return float(result["output_tok_s"])
    if bench == "offline":
        return float(next(r["output_tok_s"] for r in result["results"]
                          if r["system"] == "kvrelay"))
    return float(result["results"][path]["output_tok_s"])


def summarise(folder: Path, commit: str) -> dict[str, Any]:
    rows: dict[str, Any] = {"base_commit": commit}
    for bench, path in (("engine_overhead", ""), ("offline", ""), ("serve", "in-process"),
                        ("serve", "queue")):
        name = f"{bench} {path}".strip()
        sides = {side: [rate(json.loads(p.read_text()), bench, path)
                        for p in sorted(folder.glob(f"{side}-{bench}-*.json"))]
                 for side in ("base", "this")}
        if not all(sides.values()):
            continue
        means = {side: statistics.fmean(values) for side, values in sides.items()}
        rows[name] = {"base_tok_s": sides["base"], "this_tok_s": sides["this"],
                      "ratio_of_means": round(means["this"] / means["base"], 3)}
        print(f"{name:18} base {means['base']:6.1f} tok/s  this {means['this']:6.1f} tok/s"
              f"  this/base {means['this'] / means['base']:.3f}  "
              f"(runs: base {sides['base']}, this {sides['this']})")
    write_result(folder / "summary.json", "ab", {"base_commit": commit, "folder": folder}, rows)
    return rows


if __name__ == "__main__":
    summarise(Path(sys.argv[1]), sys.argv[2])
