"""README's error table names every error class the SDK exports, and no other."""

from __future__ import annotations

import inspect
import re

from helpers.readme_tables import code_spans, readme_table

import kvrelay


def exported_errors() -> set[str]:
    return {
        name
        for name in kvrelay.__all__
        if inspect.isclass(cls := getattr(kvrelay, name))
        and issubclass(cls, kvrelay.KvrelayError)
        and cls is not kvrelay.KvrelayError
    }


def documented_errors(rows: list[list[str]]) -> set[str]:
    """Classes in the first column, and those named as ``subclasses `X`, `Y` `` in a row."""
    names: set[str] = set()
    for first, meaning, *_ in rows:
        names.add(code_spans(first)[0])  # later spans say what it also is (`ValueError`)
        subclasses = re.search(r"subclasses? (.*)", meaning)
        if subclasses:
            names.update(code_spans(subclasses.group(1)))
    return names


def test_error_table_matches_the_exported_classes() -> None:
    documented = documented_errors(readme_table("| class | raised when |"))
    exported = exported_errors()
    assert not exported - documented, f"add to README's error table: {exported - documented}"
    assert not documented - exported, f"README documents unknown errors: {documented - exported}"
