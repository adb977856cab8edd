"""One result writer for every benchmark: the same JSON shape whoever measured what.

A result file is one JSON object. Its first five keys say what ran where:
``benchmark`` (the script's name), ``args`` (its parsed arguments), ``commit`` (the
checked-out commit, ``+dirty`` when the tree had changes), ``machine`` and ``date``
(UTC, ISO 8601). The benchmark's own figures follow at the top level, under names of its
choosing, so readers that knew a benchmark's keys before the envelope still find them
(``kvrelay bench``'s chart, ``ab_summary.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.machine import git_commit, machine_info

ENVELOPE = ("benchmark", "args", "commit", "machine", "date")


def jsonable(value: Any) -> Any:
    """``value`` with paths, tuples and other objects turned into JSON's types."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return str(value)


def envelope(benchmark: str, args: argparse.Namespace | Mapping[str, Any] | None
             ) -> dict[str, Any]:
    """What ran, with which arguments, at which commit, on which machine, when."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    return {
        "benchmark": benchmark,
        "args": jsonable(given),
        "commit": git_commit(),
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def write_result(out: str | Path, benchmark: str,
                 args: argparse.Namespace | Mapping[str, Any] | None,
                 figures: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``figures`` under the envelope to ``out`` (folders made as needed); the
    record written. A figure may not reuse an envelope key: the shape is the contract."""
    clash = set(figures) & set(ENVELOPE)
    if clash:
        raise ValueError(f"{benchmark}: {sorted(clash)} belong to the envelope")
    record = {**envelope(benchmark, args), **jsonable(figures)}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return record


def read_result(path: str | Path) -> dict[str, Any]:
    """A result file, checked to carry the envelope."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(record, dict) or list(record)[: len(ENVELOPE)] != list(ENVELOPE):
        raise ValueError(f"{path}: not a harness result (keys {ENVELOPE} first)")
    return record
