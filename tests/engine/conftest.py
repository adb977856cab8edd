"""Fixtures shared by the engine tests that run the tiny MQA model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.engine_run import one_torch_thread


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a whole module (``pytest.mark.usefixtures("one_thread")``)."""
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def folder(tiny_model: Callable[[str], Path]) -> str:
    """The tiny random MQA Llama most engine tests run on."""
    return str(tiny_model("llama-mqa"))
