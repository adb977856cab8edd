"""docs/deploy.md's Kubernetes section says what the chart does: the values keys its table
names exist with the defaults it gives, and the variables it says the chart sets are the
ones the chart refuses in ``env``."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml
from helpers.helm_chart import CHART
from helpers.readme_tables import code_spans, doc_text, readme_table

VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
SECTION = doc_text("deploy.md").split("## Kubernetes and KEDA", 1)[1]


def lookup(path: str) -> Any:
    node: Any = VALUES
    for part in path.split("."):
        assert isinstance(node, dict), f"{path}: {part!r} is below a value"
        assert part in node, f"{path}: no {part!r} in values.yaml"
        node = node[part]
    return node


def test_table_keys_exist_with_their_defaults() -> None:
    checked = 0
    for key_cell, default_cell, _ in readme_table("| key | default | what it does |", SECTION):
        keys = [k for k in code_spans(key_cell) if "<" not in k and not k.startswith(".")]
        defaults = code_spans(default_cell)
        for key in keys:
            value = lookup(key)
            checked += 1
            if len(keys) == len(defaults) and not isinstance(value, dict):
                written = json.dumps(value) if not isinstance(value, str) else value
                assert written == defaults[keys.index(key)], key
                checked += 1
    assert checked >= 12


def test_the_variables_the_chart_sets_are_the_ones_it_refuses() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    [listed] = re.findall(r'\$managed := list ((?:"[A-Z_]+" ?)+)', helpers)
    refused = set(re.findall(r'"([A-Z_]+)"', listed))
    paragraph = SECTION.split("The chart sets", 1)[1].split(" itself, from the keys", 1)[0]
    documented = {s for s in code_spans(paragraph) if s.startswith("KVRELAY_")}
    assert documented == refused
