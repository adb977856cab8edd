"""Compute-capability limits are refused when the engine is configured, not at a kernel.

No GPU here: the machine's facts (CUDA available, two devices, their capability) are
stood in for; the configuration's own validation runs as on a GPU host.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kvrelay_worker.engine import EngineConfig
from kvrelay_worker.engine.errors import EngineConfigError
from kvrelay_worker.engine.runner import device_capability
from kvrelay_worker.engine.runner.device_capability import grouped_mm_supported


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, tuple[int, int]]]:
    """Two CUDA devices whose capabilities the test sets."""
    capabilities = {0: (9, 0), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index=None: capabilities[index or 0])
    device_capability._capability.cache_clear()
    yield capabilities
    device_capability._capability.cache_clear()


@pytest.mark.parametrize("capability", [(8, 0), (7, 5), (8, 6)])
def test_fp8_kv_is_refused_before_ada(gpus: dict[int, tuple[int, int]],
                                      capability: tuple[int, int]) -> None:
    gpus[1] = capability
    with pytest.raises(EngineConfigError, match=r"fp8_e4m3.*8\.9 or newer.*cuda:1 is "
                       rf"{capability[0]}\.{capability[1]}.*'int8'"):
        EngineConfig(device="cuda:1", kv_cache_dtype="fp8_e4m3")


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_fp8_kv_is_accepted_from_ada(gpus: dict[int, tuple[int, int]],
                                     capability: tuple[int, int]) -> None:
    gpus[0] = capability
    assert EngineConfig(device="cuda", kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"


def test_int8_kv_and_the_cpu_have_no_such_limit(gpus: dict[int, tuple[int, int]]) -> None:
    gpus[0] = (7, 0)
    EngineConfig(device="cuda:0", kv_cache_dtype="int8")
    EngineConfig(device="cpu", kv_cache_dtype="fp8_e4m3")


def test_grouped_mm_runs_from_hopper_and_on_the_cpu(gpus: dict[int, tuple[int, int]]) -> None:
    gpus[1] = (8, 0)
    assert grouped_mm_supported(torch.device("cuda", 0))
    assert not grouped_mm_supported(torch.device("cuda", 1))
    assert grouped_mm_supported(torch.device("cpu"))
