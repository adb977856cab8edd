"""Judge one pytest stage of gpu_check.sh from its JUnit XML: a stage cannot pass vacuously.

    python benchmarks/gpu_stage_result.py REPORT.xml [--allow-skip REGEX]...

Prints one JSON object (tests, passed, failed, errors, skipped, and every skip whose
reason matches no ``--allow-skip`` pattern) and exits 1 when a test failed or errored,
when no test ran, or when a test skipped for a reason not allowed: on the GPU host a
"needs CUDA" or "needs the tokenizer" skip means the stage checked nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def judge(report: Path, allowed: Sequence[str]) -> dict[str, Any]:
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    unexpected: list[str] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
        elif case.find("error") is not None:
            counts["errors"] += 1
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = skip.get("message", "") or (skip.text or "")
            if not any(re.search(pattern, reason) for pattern in allowed):
                unexpected.append(f"{name}: {reason}")
        else:
            counts["passed"] += 1
    return {**counts, "unexpected_skips": unexpected}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--allow-skip", action="append", default=[], metavar="REGEX")
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(json.dumps({"error": f"no report at {args.report}: the stage did not finish"}))
        return 1
    result = judge(args.report, args.allow_skip)
    print(json.dumps(result))
    ran = result["passed"] + result["failed"] + result["errors"]
    bad = result["failed"] or result["errors"] or result["unexpected_skips"] or ran == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
