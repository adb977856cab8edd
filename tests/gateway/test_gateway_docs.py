"""docs/gateway.md lists exactly the gateway's limits and tenant-policy settings, with the
defaults the code has."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from helpers.readme_tables import code_spans, readme_table

from kvrelay.gateway.limits import RequestLimits
from kvrelay.gateway.tenant_policy import TenantPolicy

DOC = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text(encoding="utf-8")


def _rows(header: str) -> dict[str, str]:
    return {code_spans(name)[0]: default for name, default, *_ in readme_table(header, DOC)}


def test_the_limits_table_is_request_limits() -> None:
    rows = _rows("| setting | default | what happens past it |")
    defaults = RequestLimits()
    assert set(rows) == {item.name for item in fields(RequestLimits)}
    for name, cell in rows.items():
        assert cell == f"`{getattr(defaults, name)!r}`", name


def test_the_policy_table_is_tenant_policy() -> None:
    rows = _rows("| setting | default | meaning |")
    assert set(rows) == {item.name for item in fields(TenantPolicy)}
    assert rows["max_priority"] == f"`{TenantPolicy().max_priority!r}`"
