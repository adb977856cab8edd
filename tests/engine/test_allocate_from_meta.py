"""``allocate``: a module built on ``meta`` gets real storage in the target dtype at once."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from kvrelay_worker.models.allocate import allocate


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.register_buffer("positions", torch.arange(5))
        self.register_buffer("table", torch.ones(3))


def test_floating_tensors_take_the_dtype_and_the_rest_keep_theirs() -> None:
    with torch.device("meta"):
        module = _Mixed()
    out = allocate(module, torch.device("cpu"), torch.bfloat16)
    assert out is module
    assert out.proj.weight.dtype == torch.bfloat16
    assert out.proj.weight.shape == (4, 8)
    assert out.proj.bias.dtype == torch.bfloat16
    assert isinstance(out.proj.weight, nn.Parameter)
    assert out.proj.weight.requires_grad
    assert out.positions.dtype == torch.int64
    assert out.positions.shape == (5,)
    assert out.table.dtype == torch.bfloat16
    assert all(t.device.type == "cpu" for t in [*out.parameters(), *out.buffers()])
    # Storage is real: writable, and the module runs.
    with torch.no_grad():
        out.proj.weight.fill_(1.0)
        out.proj.bias.zero_()
    assert torch.equal(out.proj(torch.ones(2, 8, dtype=torch.bfloat16)),
                       torch.full((2, 4), 8.0, dtype=torch.bfloat16))


def test_allocating_does_not_import_sympy() -> None:
    """The reason it exists: ``to_empty`` pulls in sympy on first use (~0.6 s)."""
    code = ("import sys, torch\n"
            "from kvrelay_worker.models.allocate import allocate\n"
            "with torch.device('meta'):\n"
            "    m = torch.nn.Linear(4, 4)\n"
            "allocate(m, torch.device('cpu'), torch.float16)\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
