"""Regenerate the docs' performance tables and quoted figures from benchmarks/measured/.

    python benchmarks/tables.py           # rewrite README.md, docs/*.md, benchmarks/README.md
    python benchmarks/tables.py --check   # only list the pages that differ (status 1)
"""

from __future__ import annotations

import argparse
import sys

from harness.tables import rewrite, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; list stale pages")
    args = parser.parse_args(argv)
    pages = stale() if args.check else rewrite()
    for page in pages:
        print(("stale: " if args.check else "rewrote: ") + page)
    return 1 if args.check and pages else 0


if __name__ == "__main__":
    sys.exit(main())
