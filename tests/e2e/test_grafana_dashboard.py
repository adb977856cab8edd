"""``deploy/grafana/kvrelay-dashboard.json`` queries only what kvrelay exports: every series
its PromQL names is a sample a worker or a gateway serves, every label it matches or
groups by is one of those series' labels, and the panels cover what operators watch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.exported_series import gateway_series, sample_names, worker_series

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvrelay-dashboard.json"

# PromQL words that are not series: aggregation modifiers, set and vector-matching words.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan"}
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"(?:[^\"\\]|\\.)*\"")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_WORD = re.compile(r"(?<![\w:$])([A-Za-z_:][\w:]*)(?![\w:])\s*(\()?")


def series_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The series an expression reads and the labels it matches on or groups by."""
    labels = {label for _, inner in _SELECTOR.findall(expr) for label in _MATCHER.findall(inner)}
    labels |= {name.strip() for group in _GROUPING.findall(expr)
               for name in group.split(",") if name.strip()}
    bare = _SELECTOR.sub(lambda m: m.group(1), expr)  # matchers out, names kept
    bare = _GROUPING.sub(" ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # ranges: [5m], [$__rate_interval]
    series = {word for word, call in _WORD.findall(bare)
              if not call and word.lower() not in _KEYWORDS}
    return series, labels


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and isinstance(query, str):
            found.append(query)
    return found


def _label_values(query: str) -> tuple[str, str] | None:
    match = re.fullmatch(r"label_values\(\s*([\w:]+)\s*,\s*(\w+)\s*\)", query.strip())
    return (match.group(1), match.group(2)) if match else None


@pytest.mark.integration
async def test_every_query_names_exported_series_and_labels(clean_redis_url: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = sample_names(worker_series()) | sample_names(await gateway_series(clean_redis_url))
    used: set[str] = set()
    for query in queries(dashboard):
        pair = _label_values(query)
        if pair is not None:  # a template variable: label_values(series, label)
            name, label = pair
            assert name in exported, query
            assert label in exported[name], query
            used.add(name)
            continue
        series, labels = series_and_labels(query)
        assert series, f"no series in {query!r}"
        unknown = series - set(exported)
        assert not unknown, f"{query!r} names series nobody exports: {unknown}"
        known = set().union(*(exported[name] for name in series))
        assert labels <= known | {"le"}, f"{query!r} uses labels {labels - known}"
        used |= series
    for needed in ("vllm:request_success_total", "vllm:num_requests_running",
                   "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
                   "vllm:inter_token_latency_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_bucket", "vllm:kv_cache_usage_perc",
                   "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                   "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                   "vllm:num_preemptions_total", "kvrelay_queue_depth"):
        assert needed in used, f"no panel shows {needed}"


def test_the_checker_catches_a_wrong_name_or_label() -> None:
    """The parsing above finds what a typo would break (else the test proves nothing)."""
    series, labels = series_and_labels(
        'histogram_quantile(0.9, sum by (le, model) (rate(vllm:ttft_bucket{model_name=~"$m"}'
        '[$__rate_interval]))) / on (model) group_left sum(kvrelay_x) + 1e3')
    assert series == {"vllm:ttft_bucket", "kvrelay_x"}
    assert labels == {"le", "model", "model_name"}
    assert DASHBOARD.is_file()
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]
    assert all(p["targets"] and p["title"] for p in panels)
