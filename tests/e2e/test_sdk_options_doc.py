"""docs/sdk-options.md lists exactly the SDK's constructor arguments and call keywords,
with the defaults the code has."""

from __future__ import annotations

import inspect
import typing

from helpers.readme_tables import README, code_spans, readme_table

from kvrelay import AsyncClient, GenerateOptions
from kvrelay.protocol import SamplingOptions

DOC = (README.parent / "docs" / "sdk-options.md").read_text(encoding="utf-8")


def _rows(header: str) -> dict[str, str]:
    return {code_spans(name)[0]: default for name, default, *_ in readme_table(header, DOC)}


def test_constructor_table_is_the_signature() -> None:
    rows = _rows("| argument | default |")
    parameters = inspect.signature(AsyncClient.__init__).parameters
    documented = {name: parameters[name].default for name in parameters if name != "self"}
    assert set(rows) == set(documented)
    for name, default in documented.items():
        assert rows[name] == f"`{default!r}`", name


def test_call_keywords_are_generate_options_with_the_wire_defaults() -> None:
    rows = _rows("| keyword | default |")
    assert set(rows) == set(typing.get_type_hints(GenerateOptions))
    wire = SamplingOptions()
    for field in SamplingOptions.__struct_fields__:
        value = getattr(wire, field)
        expected = "`None`" if value in ([], {}) else f"`{value!r}`"
        assert rows[field] == expected, field
