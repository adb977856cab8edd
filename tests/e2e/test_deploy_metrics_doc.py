"""docs/deploy.md says what each metric means: its tables name every series a worker and a
gateway export, each with its type and labels, and nothing they do not export."""

from __future__ import annotations

import pytest
from helpers.exported_series import gateway_series, worker_series
from helpers.readme_tables import code_spans, doc_text

HEADER = "| series | type | labels | meaning |"
# How a table writes a family's name: counters with their _total, as queried.
_SUFFIX = {"counter": "_total", "gauge": "", "histogram": ""}


def documented() -> dict[str, tuple[str, set[str]]]:
    """``{name as written: (type, labels)}`` over every metrics table of docs/deploy.md."""
    rows: dict[str, tuple[str, set[str]]] = {}
    lines = doc_text("deploy.md").splitlines()
    for index, line in enumerate(lines):
        if not line.startswith(HEADER):
            continue
        for row in lines[index + 2:]:
            if not row.startswith("|"):
                break
            name, kind, labels, meaning = (cell.strip() for cell in row.strip("|").split("|")[:4])
            (series,) = code_spans(name)
            assert series not in rows, f"{series} documented twice"
            assert meaning, f"{series} has no meaning"
            rows[series] = (kind, set(code_spans(labels)))
    return rows


@pytest.mark.integration
async def test_every_exported_series_is_documented_as_it_is(clean_redis_url: str) -> None:
    exported: dict[str, tuple[str, set[str]]] = {}
    for scraped in (worker_series(), await gateway_series(clean_redis_url)):
        for family, kind in scraped.types.items():
            if family.endswith("_created"):
                continue  # prometheus_client's creation times, beside each counter
            labels = scraped.labels.get(family, set()) - {"le"}
            exported[family + _SUFFIX[kind]] = (kind, labels)
    rows = documented()
    assert sorted(set(exported) - set(rows)) == [], "exported but not documented"
    assert sorted(set(rows) - set(exported)) == [], "documented but not exported"
    wrong = {name: (rows[name], exported[name]) for name in rows if rows[name] != exported[name]}
    assert wrong == {}, "documented type or labels differ from the exported ones"
