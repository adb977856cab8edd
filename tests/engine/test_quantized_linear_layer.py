"""The quantized linear layer keeps one checked weight for all its calls, and drops it
when its tensors change, so a moved or reloaded layer never multiplies stale tensors."""

from __future__ import annotations

import pytest
import torch

from kvrelay_kernels import KernelArgumentError
from kvrelay_kernels.quantized_weight import quantize_int4, quantize_int8
from kvrelay_kernels.reference.quantized_matmul import dequantize_weight
from kvrelay_worker.models.quantized_linear import QuantizedLinear


def test_the_weight_is_built_once_and_matches_the_buffers() -> None:
    layer = QuantizedLinear(quantize_int8(torch.randn(32, 64)))
    first = layer.quantized
    assert layer.quantized is first
    assert first.qweight is layer.qweight
    x = torch.randn(3, 64)
    torch.testing.assert_close(layer(x), x @ dequantize_weight(first).T, rtol=1e-4,
                               atol=1e-3)


def test_replacing_a_tensor_drops_the_cached_weight() -> None:
    layer = QuantizedLinear(quantize_int8(torch.randn(32, 64)))
    stale = layer.quantized
    other = quantize_int8(torch.randn(32, 64))
    layer.qweight = other.qweight
    layer.scales = other.scales
    assert layer.quantized is not stale
    x = torch.randn(1, 64)
    torch.testing.assert_close(layer(x), x @ dequantize_weight(other).T, rtol=1e-4,
                               atol=1e-3)


def test_moving_the_layer_drops_the_cached_weight() -> None:
    layer = QuantizedLinear(quantize_int4(torch.randn(32, 64), 32))
    stale = layer.quantized
    layer.to(torch.float32)  # _apply: the buffers may be replaced by new tensors
    assert layer.quantized is not stale
    assert layer.quantized.qweight is layer.qweight


def test_a_bad_replacement_is_refused_at_the_next_call() -> None:
    layer = QuantizedLinear(quantize_int8(torch.randn(32, 64)))
    layer.quantized  # noqa: B018 (builds the cache)
    layer.scales = torch.ones(31, 1)
    with pytest.raises(KernelArgumentError, match="scales"):
        layer(torch.randn(1, 64))
