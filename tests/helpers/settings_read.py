"""Which ``KVRELAY_*`` variables the code reads, who reads them, and their defaults,
found in the code itself (so settings added later are found without a list to update).

Reads are: ``os.environ.get(X)`` / ``os.getenv(X)`` / ``os.environ[X]``, the CLI's
``env_value("NAME")`` / ``env_float("NAME", default)``, the ``envvar`` of every option of
every ``kvrelay`` command (from the click commands themselves), the fields of
``WorkerSettings`` (read as ``KVRELAY_<FIELD>``) and ``${X:-default}`` in compose.yaml.
``X`` may be a string or a module-level constant holding one.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections import defaultdict
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[2]
PREFIX = "KVRELAY_"

# Where code lives -> who it is (the README's "Used by" names).
_USERS = (
    ("client/kvrelay/cli", "CLI"),
    ("client/kvrelay/gateway", "gateway"),
    ("client/kvrelay", "SDK"),
    ("worker/kvrelay_worker", "worker"),
    ("kernels/kvrelay_kernels", "worker"),  # the kernels run inside workers
    ("tests", "tests"),
)
# Helpers whose argument is the name without the prefix.
_UNPREFIXED = {"env_value", "env_float"}
_ENVIRON_CALLS = {"get", "getenv"}


@dataclasses.dataclass
class Reads:
    users: dict[str, set[str]] = dataclasses.field(default_factory=lambda: defaultdict(set))
    defaults: dict[str, set[str]] = dataclasses.field(default_factory=lambda: defaultdict(set))

    def add(self, name: str, user: str, default: object = None) -> None:
        self.users[name].add(user)
        if isinstance(default, bool):
            default = str(default).lower()
        if default is not None and default != "":  # "" reads as unset
            self.defaults[name].add(str(default))


def _constants(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(
            value.value, str
        ):
            found[target.id] = value.value
    return found


def _text(node: ast.expr | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _literal(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _scan_python(path: Path, user: str, reads: Reads) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = _constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr == "environ":
                name = _text(node.slice, constants)
                if name and name.startswith(PREFIX):
                    reads.add(name, user)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        args = node.args
        if called in _ENVIRON_CALLS and isinstance(func, ast.Attribute) and args:
            owner = func.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            name = _text(args[0], constants)
            if owner_name in ("environ", "os") and name and name.startswith(PREFIX):
                reads.add(name, user, _literal(args[1]) if len(args) > 1 else None)
        elif called in _UNPREFIXED:
            name = _text(args[0], constants) if args else None
            if name:
                reads.add(PREFIX + name, user, _literal(args[1]) if len(args) > 1 else None)


def _scan_commands(command: click.Command, reads: Reads) -> None:
    """Options of ``command`` and its sub-commands that fall back to a variable."""
    for param in command.params:
        envvars = [param.envvar] if isinstance(param.envvar, str) else param.envvar or []
        default = param.default if isinstance(param.default, str | int | float) else None
        for name in envvars:
            reads.add(name, "CLI", default)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _scan_commands(sub, reads)


def _user_of(path: Path) -> str | None:
    relative = path.relative_to(REPO).as_posix()
    for folder, user in _USERS:
        if relative.startswith(folder + "/"):
            return user
    return None


@functools.cache
def settings_read() -> Reads:
    """Every ``KVRELAY_*`` variable the code reads, with its readers and defaults."""
    reads = Reads()
    for folder, _ in _USERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            user = _user_of(path)
            if user is not None:
                _scan_python(path, user, reads)
    from kvrelay.cli.main import cli
    from kvrelay_worker.settings import WorkerSettings

    _scan_commands(cli, reads)
    for field in dataclasses.fields(WorkerSettings):
        if field.name == "worker_id":  # generated, never read
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        reads.add(PREFIX + field.name.upper(), "worker", default)
        if default is None:
            _engine_default(field.name, reads)
    compose = (REPO / "compose.yaml").read_text(encoding="utf-8")
    for name, default in re.findall(r"\$\{(KVRELAY_\w+):-([^}]*)\}", compose):
        reads.add(name, "compose", default)
    return reads


def _engine_default(field_name: str, reads: Reads) -> None:
    """A worker setting left unset falls back to the engine's own default."""
    from kvrelay_worker.engine.config import EngineConfig

    for field in dataclasses.fields(EngineConfig):
        if field.name == field_name and field.default is not dataclasses.MISSING:
            reads.defaults[PREFIX + field_name.upper()].add(str(field.default))
