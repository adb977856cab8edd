"""Stand in for the GPU host's Python environment on this machine: only its packages import.

The GPU host reaches no package registry. What it has is listed in
``benchmarks/gpu_host_packages.txt``; what it lacks travels as wheels in the bundle
(``benchmarks/gpu_bundle.sh``). ``gpu_check.sh --dry-run`` runs each stage's collection
through this module, so an import of a package that is neither on the host nor carried
fails here, where it is cheap, instead of there, inside a GPU window:

    python benchmarks/gpu_host_env.py --wheels .whl -- -m pytest --collect-only ...
    python benchmarks/gpu_host_env.py --wheels .whl -- benchmarks/gpu_kernels.py --help

Everything after ``--`` is run as ``python ...`` would run it (``-m module``, ``-c code``
or a script),
in this process, with an import hook in front: when this repository's code (the tree's
folders, not an installed package) imports a top-level module that belongs to an installed
distribution outside (host packages + wheel names + this project's own), the import raises
``ModuleNotFoundError``. The standard library imports as usual, and so do a package's own
imports: the versions here are this machine's, whose needs may differ from the host's
(the host's packages bring theirs; the wheels' needs are checked by name against the same
lists, ``check_bundle``).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import re
import runpy
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HOST_PACKAGES = HERE / "gpu_host_packages.txt"
# This repository's own distributions: they travel as source in the working tree.
OWN = {"kvrelay", "kvrelay-kernels", "kvrelay-worker"}
# The GPU host's interpreter, for evaluating the wheels' environment markers.
HOST_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3",
                "platform_system": "Linux", "platform_machine": "x86_64",
                "sys_platform": "linux", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def host_packages(path: Path = HOST_PACKAGES) -> set[str]:
    """The distributions the GPU host has (one name a line, ``#`` comments)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalize(line.split()[0]))
    return names


def wheel_name(path: Path) -> str:
    return normalize(path.name.split("-", 1)[0])


def wheel_requirements(path: Path) -> list[str]:
    """The distributions a wheel needs on the host (extras left out, markers evaluated)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(path) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        text = wheel.read(meta).decode()
    needs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({**HOST_MARKERS, "extra": ""}):
            continue
        needs.append(normalize(req.name))
    return needs


def check_bundle(wheels: Iterable[Path], host: set[str]) -> list[str]:
    """Problems with the carried wheels: duplicates, and needs neither host nor bundle meets."""
    wheels = list(wheels)
    problems = []
    names = [wheel_name(w) for w in wheels]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"two wheels of {name}: pip's install on the host stops on that")
    carried = set(names)
    for wheel in wheels:
        for need in wheel_requirements(wheel):
            if need not in host and need not in carried:
                problems.append(f"{wheel.name} needs {need}: not on the GPU host, not carried")
    return problems


class HostOnlyFinder(importlib.abc.MetaPathFinder):
    """Refuses top-level imports of installed distributions the GPU host would not have."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.owners = metadata.packages_distributions()

    @staticmethod
    def _asked_by_this_tree() -> bool:
        """Whether the import statement being run is in this repository's own code."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<frozen") and name != __file__:
                path = Path(name).resolve()
                return path.is_relative_to(ROOT) and ".venv" not in path.parts
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if "." in fullname or not self._asked_by_this_tree():
            return None
        owners = {normalize(d) for d in self.owners.get(fullname, [])}
        if owners and not owners & self.allowed:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} on the GPU host: {', '.join(sorted(owners))} "
                "is neither among benchmarks/gpu_host_packages.txt nor carried as a wheel "
                "(benchmarks/gpu_bundle.sh)", name=fullname)
        return None


def install(allowed: set[str]) -> None:
    finder = HostOnlyFinder(allowed)
    for name in [n for n in sys.modules if "." not in n]:
        owners = {normalize(d) for d in finder.owners.get(name, [])}
        if owners and not owners & allowed and name not in sys.builtin_module_names:
            # Imported before the hook (by site, say): make the next import go through it.
            del sys.modules[name]
    sys.meta_path.insert(0, finder)


def main(argv: Sequence[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: gpu_host_env.py [--wheels DIR] [--check-bundle] -- ARGS")
    split = list(argv).index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheels", type=Path, help="the bundle's wheel folder")
    parser.add_argument("--check-bundle", action="store_true",
                        help="check the wheels' own needs, then run nothing")
    args = parser.parse_args(argv[:split])
    rest = list(argv[split + 1:])
    host = host_packages()
    wheels = sorted(args.wheels.glob("*.whl")) if args.wheels else []
    if args.check_bundle:
        problems = check_bundle(wheels, host)
        for problem in problems:
            print(f"gpu_host_env: {problem}", file=sys.stderr)
        return 1 if problems else 0
    install(host | {wheel_name(w) for w in wheels} | OWN)
    if rest[:1] == ["-c"]:
        sys.argv = ["-c", *rest[2:]]
        exec(compile(rest[1], "<gpu_host_env -c>", "exec"), {"__name__": "__main__"})
    elif rest[:1] == ["-m"]:
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path.insert(0, str(Path(rest[0]).resolve().parent))
        runpy.run_path(rest[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
