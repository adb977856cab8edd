"""The configuration table (docs/configuration.md) is what the code reads: the same variables, the same
readers ("Used by"), the same defaults. The variables are found in the code itself
(``helpers.settings_read``), not in a list kept beside it."""

from __future__ import annotations

import functools

import pytest
from helpers.readme_tables import code_spans, doc_text, readme_table
from helpers.settings_read import settings_read


@functools.cache
def readme_rows() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for name, default, users, *_ in readme_table("| Variable | Default | Used by |", doc_text("configuration.md")):
        (variable,) = code_spans(name)
        rows[variable] = (default, {user.strip() for user in users.split(",")})
    return rows


def test_every_variable_read_is_documented_and_nothing_else() -> None:
    read = set(settings_read().users)
    documented = set(readme_rows())
    assert not read - documented, f"read by the code, missing from README: {read - documented}"
    assert not documented - read, f"in README, read by no code: {documented - read}"


@pytest.mark.parametrize("name", sorted(readme_rows()))
def test_used_by_names_the_readers(name: str) -> None:
    readers = settings_read().users.get(name, set())
    assert readme_rows()[name][1] == readers, f"{name} is read by {sorted(readers)}"


def _same(documented: str, actual: str) -> bool:
    try:
        return float(documented) == float(actual)
    except ValueError:
        return documented == actual


@pytest.mark.parametrize("name", sorted(readme_rows()))
def test_default_is_the_code_default(name: str) -> None:
    cell = readme_rows()[name][0]
    if not cell.startswith("`"):
        return  # "(off)", "(the model's)": a description, not a value
    (documented,) = code_spans(cell)
    defaults = settings_read().defaults.get(name, set())
    wrong = {actual for actual in defaults if not _same(documented, actual)}
    assert not wrong, f"README says {name} defaults to {documented!r}; the code: {wrong}"
