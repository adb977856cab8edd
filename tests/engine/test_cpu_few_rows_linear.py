"""``cpu_few_rows_linear`` equals ``F.linear`` (with and without bias, 1 to 17 rows) and
returns a contiguous row-major tensor, as the attention kernels require of their inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvrelay_worker.models.cpu_linear import MAX_FEW_ROWS, Linear, cpu_few_rows_linear


@pytest.mark.parametrize("rows", [1, 2, 5, MAX_FEW_ROWS, MAX_FEW_ROWS + 1])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_f_linear(rows: int, bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=generator)
    weight = torch.randn(200, 96, generator=generator)
    b = torch.randn(200, generator=generator) if bias else None
    out = cpu_few_rows_linear(x, weight, b)
    assert out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_the_module_keeps_nn_linear_parameters() -> None:
    layer = Linear(8, 4, bias=True)
    assert sorted(name for name, _ in layer.named_parameters()) == ["bias", "weight"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    half = Linear(8, 4).to(torch.bfloat16)  # other dtypes: F.linear itself
    assert half(x.to(torch.bfloat16)).dtype == torch.bfloat16
