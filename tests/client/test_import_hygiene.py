"""``import kvrelay`` must stay light: applications install it without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "triton", "numpy")


@pytest.mark.timeout(60)
def test_import_kvrelay_leaves_heavy_modules_out() -> None:
    code = (
        "import json, sys\n"
        "import kvrelay\n"
        "from kvrelay import AsyncClient, Client, Completion, StreamChunk\n"
        "AsyncClient('redis://127.0.0.1:1/0', model='m')\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
        "print(json.dumps('celery' in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert result.returncode == 0, result.stderr
    heavy_line, celery_line = result.stdout.strip().splitlines()[-2:]
    assert json.loads(heavy_line) == []
    # Celery is only imported on the first enqueue.
    assert json.loads(celery_line) is False
