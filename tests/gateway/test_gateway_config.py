"""The gateway's config file: defaults, overrides, mistakes refused by name; and the JSON
nesting scan that runs before any parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvrelay.gateway.body import json_depth
from kvrelay.gateway.config_file import load_config
from kvrelay.gateway.limits import RequestLimits
from kvrelay.gateway.tenant_policy import TenantPolicy


def test_an_empty_file_keeps_every_default(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("")
    config = load_config(path)
    assert config.limits == RequestLimits()
    assert config.policies.of("anyone") == TenantPolicy()
    assert TenantPolicy().max_priority == 0


def test_tables_override_and_tenants_inherit_the_default(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[limits]\nmax_body_bytes = 1024\nsend_timeout = 2\n"
                    "[tenants.default]\nmax_jobs = 4\nrequests_per_second = 2.5\n"
                    "[tenants.alice]\nmax_priority = 10\n")
    config = load_config(path)
    assert config.limits.max_body_bytes == 1024
    assert config.limits.send_timeout == 2.0
    assert config.policies.of("bob") == TenantPolicy(max_jobs=4, requests_per_second=2.5)
    assert config.policies.of("alice") == TenantPolicy(max_priority=10, max_jobs=4,
                                                       requests_per_second=2.5)


@pytest.mark.parametrize(("text", "named"), [
    ("[limits]\nmax_body = 5\n", "max_body"),
    ("[limits]\nmax_body_bytes = 0\n", "max_body_bytes"),
    ("[limits]\nmax_body_bytes = 1.5\n", "max_body_bytes"),
    ("[limits]\nbody_timeout = nan\n", "body_timeout"),
    ("[tenants.alice]\nmax_jobs = 0\n", "tenants.alice"),
    ("[tenants.alice]\npriority = 3\n", "priority"),
    ("[tenant.alice]\n", "tenant"),
    ("[limits\n", "gateway.toml"),
])
def test_mistakes_are_refused_by_name(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=named):
        load_config(path)


@pytest.mark.parametrize("value", [
    {}, [], 1, "[[[", {"a": [1, {"b": "]]]}}"}]}, ["\\", ["\"]"]], {"k\"[": [[["x\\\\"]]]},
    [[[[[[[[[[]]]]]]]]]],
])
def test_json_depth_matches_the_structure(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    assert json_depth(json.dumps(value).encode()) == depth(value)
