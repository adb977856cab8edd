"""Every code example in README.md and docs/ runs, as written, against a real worker
serving SmolLM2.

Examples are the ```python blocks preceded by an ``<!-- example: NAME -->`` marker. Each
runs in a fresh interpreter; the only change is the Redis URL, pointed at the test's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.readme_tables import usage_pages
from helpers.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\s*```python\n(?P<code>.*?)```", re.S)


def _found(pattern: re.Pattern[str]) -> list[re.Match[str]]:
    """Every match of ``pattern`` over the usage pages; a name used twice is a mistake."""
    matches = [m for page in usage_pages() for m in pattern.finditer(page.read_text())]
    names = [m["name"] if pattern is EXAMPLE else f"{m['kind']}-{m['name']}" for m in matches]
    assert len(names) == len(set(names)), f"an example name is used twice: {names}"
    return matches


def examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in _found(EXAMPLE)}


def test_readme_has_the_api_examples() -> None:
    assert {"generate", "stream", "resume", "errors", "sync", "offline"} <= set(examples())


@pytest.mark.parametrize("name", sorted(examples()))
def test_example_runs(name: str, smollm2_worker: tuple[str, WorkerProcess]) -> None:
    url, _ = smollm2_worker
    code = examples()[name].replace("redis://localhost:6379/0", url)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{name} printed nothing"


GATEWAY_EXAMPLE = re.compile(
    r"<!-- (?P<kind>gateway|curl)-example: (?P<name>[\w-]+) -->\s*```(?:python|bash)\n"
    r"(?P<code>.*?)```", re.S)


def gateway_examples() -> dict[str, tuple[str, str]]:
    return {f"{m['kind']}-{m['name']}": (m["kind"], m["code"])
            for m in _found(GATEWAY_EXAMPLE)}


def test_readme_has_the_gateway_examples() -> None:
    assert {"gateway-openai", "curl-chat", "curl-resume"} <= set(gateway_examples())


@pytest.mark.parametrize("name", sorted(gateway_examples()))
def test_gateway_example_runs(name: str, smollm2_worker: tuple[str, WorkerProcess],
                              tmp_path: Path) -> None:
    from helpers.gateway_process import GatewayProcess

    url, _ = smollm2_worker
    kind, code = gateway_examples()[name]
    gateway = GatewayProcess(url, tmp_path).start()
    try:
        code = code.replace("http://localhost:8000", gateway.url)
        # (no pipefail: `curl | head` cuts curl off on purpose in the resume example)
        argv = [sys.executable, "-c", code] if kind == "gateway" else ["bash", "-eu", "-c", code]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                                cwd=tmp_path)
    finally:
        gateway.stop()
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    out = result.stdout.strip()
    assert out, f"{name} printed nothing"
    if name == "gateway-openai":
        assert "Paris" in out
    if name == "curl-chat":
        assert '"Paris' in out or " Paris" in out
    if name == "curl-resume":
        assert out.endswith("data: [DONE]")
        assert "id: " in out
