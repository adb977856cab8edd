"""The engine's option lists live once, in a module the worker's settings can import
without torch, and the CLI's variable table (which cannot import the worker) agrees."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvrelay.cli.config import BY_NAME
from kvrelay_worker.engine import options


def test_the_options_and_the_settings_load_without_torch() -> None:
    code = ("import sys; import kvrelay_worker.engine.options, kvrelay_worker.settings; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("variable", "choices"), [
    ("KVRELAY_QUANTIZATION", options.QUANTIZATIONS),
    ("KVRELAY_QUANTIZATION_GROUP_SIZE", tuple(map(str, options.QUANTIZATION_GROUP_SIZES))),
    ("KVRELAY_PREEMPTION_MODE", options.PREEMPTION_MODES),
    ("KVRELAY_KV_CACHE_DTYPE", options.KV_CACHE_DTYPE_CHOICES),
])
def test_the_cli_table_offers_the_engines_choices(variable: str,
                                                  choices: tuple[str, ...]) -> None:
    assert set(BY_NAME[variable].choices) == set(choices)

