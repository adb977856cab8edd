"""The images are what they claim, read from their Dockerfiles stage by stage (no Docker
engine here; deploy/smoke.sh builds and runs them): the toolchain stays in the build
stage, the runtimes copy the compiled CPU kernels where the kernels look for them, the
CPU target converts no model and carries no Triton, both run as a user, and the gateway
image holds the client package alone."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "worker" / "Dockerfile"
GATEWAY = REPO / "deploy" / "gateway" / "Dockerfile"
TOOLCHAIN = ("g++", "ninja-build", "gcc")


@dataclass
class Stage:
    name: str
    parent: str
    text: str  # its instructions, continuation lines joined

    def apt_installs(self) -> set[str]:
        found: set[str] = set()
        for packages in re.findall(r"apt-get install -y --no-install-recommends ([^&]+)",
                                   self.text):
            found |= set(packages.split())
        return found

    def users(self) -> list[str]:
        return re.findall(r"^USER (\S+)", self.text, re.M)


def stages(dockerfile: Path) -> dict[str, Stage]:
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    found: dict[str, Stage] = {}
    for match in re.finditer(r"^FROM (\S+) AS (\S+)\n(.*?)(?=^FROM |\Z)", text, re.M | re.S):
        parent, name, body = match.groups()
        found[name] = Stage(name, parent, body)
    return found


def lineage(all_stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [all_stages[name]]
    while chain[-1].parent in all_stages:
        chain.append(all_stages[chain[-1].parent])
    return chain


@pytest.fixture(scope="module")
def worker() -> dict[str, Stage]:
    return stages(WORKER)


def test_the_toolchain_stays_in_the_build_stage(worker: dict[str, Stage]) -> None:
    assert {"g++", "ninja-build"} <= worker["build"].apt_installs()
    assert "python -m kvrelay_kernels.cpu_kernels.build" in worker["build"].text
    for stage in lineage(worker, "cpu"):
        assert not stage.apt_installs() & set(TOOLCHAIN), stage.name
    # The GPU runtime keeps gcc for Triton's launcher, never g++ or ninja.
    assert not {"g++", "ninja-build"} & worker["gpu"].apt_installs()


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runtimes_copy_the_compiled_kernels_where_they_are_looked_for(
        worker: dict[str, Stage], target: str) -> None:
    """The build folder's name keys the install path, Python and torch: the runtime must
    take the whole environment from a build stage, at the same path, and share the
    TORCH_EXTENSIONS_DIR the build wrote to."""
    (source,) = re.findall(r"^COPY --from=(\S+) /opt/kvrelay /opt/kvrelay$",
                           worker[target].text, re.M)
    assert "build" in [s.name for s in lineage(worker, source)]
    python = worker["python"]
    assert "TORCH_EXTENSIONS_DIR=/opt/kvrelay/" in python.text
    assert {s.name for s in lineage(worker, target)} >= {"python"}
    assert "build" not in [s.name for s in lineage(worker, target)]


def test_the_cpu_target_serves_the_gguf_as_it_is(worker: dict[str, Stage]) -> None:
    chain = lineage(worker, "cpu")
    assert not any("kvrelay models prepare" in stage.text for stage in chain)
    assert "kvrelay models prepare" in worker["gpu"].text  # float weights on a GPU
    assert "KVRELAY_DEVICE=cpu" in worker["cpu"].text
    assert "pip uninstall -y triton" in worker["build-cpu"].text
    (source,) = re.findall(r"^COPY --from=(\S+) /opt/kvrelay", worker["cpu"].text, re.M)
    assert source == "build-cpu"


@pytest.mark.parametrize(("dockerfile", "target"), [(WORKER, "cpu"), (WORKER, "gpu"),
                                                     (GATEWAY, "gateway")])
def test_runs_as_a_user(dockerfile: Path, target: str) -> None:
    users = [u for stage in reversed(lineage(stages(dockerfile), target)) for u in stage.users()]
    assert users, f"{target} never names a user"
    assert users[-1] not in ("root", "0"), f"{target} must not run as root"


def test_the_default_target_is_the_gpu_worker(worker: dict[str, Stage]) -> None:
    assert list(worker)[-1] == "gpu"


def test_pip_trusts_a_ca_given_as_a_secret_never_copied() -> None:
    for dockerfile in (WORKER, GATEWAY):
        text = dockerfile.read_text(encoding="utf-8")
        pip_steps = re.findall(r"^RUN (.*?pip install.*?)$", re.sub(r"\\\n\s*", " ", text), re.M)
        assert pip_steps, dockerfile
        for step in pip_steps:
            assert step.startswith("--mount=type=secret,id=ca"), step
        assert not re.search(r"^(COPY|ADD) .*\.(crt|pem)\b", text, re.M)


def test_the_gateway_image_holds_the_client_alone() -> None:
    all_stages = stages(GATEWAY)
    text = GATEWAY.read_text(encoding="utf-8")
    assert re.search(r'pip install "/opt/kvrelay-src/client\[gateway\]"', text)
    assert not re.search(r"torch|kernels|worker/", text.split("FROM", 1)[1])
    assert all_stages["gateway"].text.count("COPY --from=build /opt/kvrelay /opt/kvrelay") == 1
    assert re.search(r'^CMD \["kvrelay", "gateway", "--host", "0.0.0.0"', text, re.M)
    ignore = (GATEWAY.parent / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    assert [line for line in ignore.splitlines() if line.startswith("!")] == ["!client/"]
