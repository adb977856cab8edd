"""Each sampling option's bound is written in the wire contract (``kvrelay/sampling_wire.py``,
re-exported by ``kvrelay/protocol.py``) and nowhere else.

A static scan of the package sources (client, worker, kernels; tests and benchmarks
aside) for the shapes a second copy of a bound takes: a bound constant, a msgspec
``Meta``, a comparison of an option with a number that leads to a refusal, a range given
to an option by keyword (``minimum=``) or as a click range. The options' names come from
the wire struct, so a new option is covered the day it is added.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from kvrelay.protocol import SamplingOptions

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "client" / "kvrelay", ROOT / "worker" / "kvrelay_worker",
            ROOT / "kernels" / "kvrelay_kernels"]
HOME = ROOT / "client" / "kvrelay" / "protocol.py"
SAMPLING_HOME = ROOT / "client" / "kvrelay" / "sampling_wire.py"
# The contract's per-feature modules, which protocol.py re-exports (sampling, adapters,
# tools, tracing): part of the one home, not copies of it.
WIRE_MODULES = frozenset((ROOT / "client" / "kvrelay").glob("*_wire.py"))
FIELDS = frozenset(SamplingOptions.__struct_fields__) | {"priority"}
# Constant names a copy of a sampling bound would carry.
BOUND_NAME = re.compile(
    r"^_?(MAX|MIN)_?(N|TOKENS?|LOGPROBS|SEED|TOP_K|TOP_P|MIN_P|TEMPERATURE|PENALTY|"
    r"REPETITION_PENALTY|OCCURRENCE_PENALTY|STOP\w*|LOGIT_BIAS\w*|PRIORITY|TOKEN_ID)$"
    r"|^_?SEED_\w+$"
)


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from (p for p in sorted(package.rglob("*.py")) if p != HOME and p not in WIRE_MODULES)


def mentions_field(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in FIELDS:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in FIELDS:
            return True
        if isinstance(sub, ast.Constant) and sub.value in FIELDS:
            return True
    return False


def is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    return isinstance(node, ast.Name) and BOUND_NAME.match(node.id) is not None


def refuses(body: list[ast.stmt]) -> bool:
    for stmt in body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Raise):
                return True
            if isinstance(sub, ast.Call) and "fail" in ast.unparse(sub.func).lower():
                return True
    return False


def copies_of_bounds(source: str, where: str) -> Iterator[str]:
    tree = ast.parse(source, filename=where)
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and BOUND_NAME.match(target.id):
                    yield f"{line}: bound constant {target.id}"
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith("Meta"):
                yield f"{line}: a msgspec Meta constraint"
            first = node.args[0] if node.args else None
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and first.value.lstrip("-").replace("-", "_") in FIELDS):
                ranged = [k.arg for k in node.keywords
                          if k.arg in {"minimum", "maximum", "min", "max"} and is_number(k.value)]
                ranges = [ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)
                          and ast.unparse(c.func).endswith(("IntRange", "FloatRange"))
                          and (c.args or c.keywords)]
                if ranged or ranges:
                    yield f"{line}: {first.value} given a range {ranged or ranges}"
        elif isinstance(node, ast.If) and refuses(node.body):
            for cmp in ast.walk(node.test):
                if (isinstance(cmp, ast.Compare) and mentions_field(cmp)
                        and any(is_number(x) for x in [cmp.left, *cmp.comparators])):
                    yield f"{line}: refuses on {ast.unparse(cmp)}"


SECOND_COPIES = """
MAX_LOGPROBS = 20
_SEED_LIMIT = 1 << 63
n: Annotated[int, msgspec.Meta(ge=1)] = 1
if not 0 <= self.logprobs <= MAX_LOGPROBS:
    _fail("logprobs")
if options["top_k"] < -1:
    raise InvalidRequest("top_k")
kw["top_p"] = _float("top_p", get("top_p"), minimum=0.0, maximum=1.0)
option = click.option("--max-tokens", type=click.IntRange(min=1), default=16)
"""


def test_the_scan_finds_each_shape_of_a_second_copy() -> None:
    """The scan must see a copied bound, or it could never fail."""
    found = list(copies_of_bounds(SECOND_COPIES, "example.py"))
    assert sorted(int(hit.split(":")[1]) for hit in found) == [2, 3, 4, 5, 7, 9, 10], found
    assert any("Meta" in hit for hit in copies_of_bounds(SAMPLING_HOME.read_text(), "sampling_wire.py"))


def test_no_sampling_bound_outside_the_protocol_module() -> None:
    found = [hit for path in sources()
             for hit in copies_of_bounds(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_cli_reads_its_ranges_from_the_wire_struct() -> None:
    """``--top-p 0`` and ``--max-tokens 0`` are refused by click, from the same bounds."""
    import click

    from kvrelay.cli.options import sampling_range

    def accepts(field: str, text: str) -> bool:
        try:
            sampling_range(field).convert(text, None, None)
        except click.BadParameter:
            return False
        return True

    assert [accepts("top_p", v) for v in ("0", "0.001", "1", "1.01")] == [False, True, True, False]
    # 0 is in the wire's range (with prompt_logprobs, which the request's own rule checks).
    assert [accepts("max_tokens", v) for v in ("-1", "0", str(2**24), str(2**24 + 1))] == [
        False, True, True, False]
    assert [accepts("seed", v) for v in (str(-(2**63)), str(2**63))] == [True, False]
    assert [accepts("temperature", v) for v in ("-0.1", "0", "100", "nan")] == [
        False, True, True, False]
