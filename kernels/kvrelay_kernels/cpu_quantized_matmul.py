"""Weight-only quantized matmul on CPU: a dequantize-multiply-reduce loop compiled by inductor.

Batch-1 decode streams every weight byte once per token, so its speed is the bytes read:
the loop below, compiled by ``torch.compile``, beats both the float32 ``F.linear``
(four bytes per weight) and ``aten._weight_int8pack_mm``. The generated C++ reads the packed bytes, converts them to float in vector registers and
multiplies into the running sum; the float weight is never written out.

For many rows (prefill, large batches) the loop's per-row vector arithmetic loses to the
float GEMM's blocked kernels: rows above ``DEQUANTIZE_ABOVE_ROWS`` dequantize
``TILE_ROWS`` output channels at a time (a tile that stays in cache) and multiply each
tile with ``F.linear`` (``benchmarks/quant_matmul_rows.py`` measures the crossing).

Shapes are static (one compiled kernel per weight shape and row count up to
``DEQUANTIZE_ABOVE_ROWS``, so at most 4 per shape; the tiled path's dequantize kernel does
not depend on the row count): symbolic shapes made inductor's loops far slower. Compiled
code is cached on disk in inductor's cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the kvrelay cache),
so a restarted worker loads it instead of compiling again. Any failure to compile (no C++
compiler) switches this process to the reference path, once, with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kvrelay_kernels.quantized_weight import QuantizedWeight

log = logging.getLogger(__name__)

# Rows (tokens) above which the tiled dequantize-then-GEMM path is taken. Not settled by
# measurement yet (benchmarks/quant_matmul_rows.py has shown no clear crossing on a
# loaded machine; re-measure on an idle one): 4 bounds the compiled row counts per shape,
# and the tiled path keeps many-request batches level with float32 while batch-1 decode
# keeps the fused loop's gain.
DEQUANTIZE_ABOVE_ROWS = 4
# Output channels dequantized at a time on that path: 256 x 1536 float32 is 1.5 MiB.
TILE_ROWS = 256

Kernel = Callable[..., torch.Tensor]
_compiled: dict[tuple[str, int, int, int, int], Kernel] = {}
_broken: list[str] = []  # the reason compilation failed in this process, once it has


def _int8_rows(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, k = qweight.shape
    g = k // scales.shape[1]
    scale = scales.float()[:, :, None].expand(n, k // g, g).reshape(n, k)
    return (x.float()[:, None, :] * (qweight.float() * scale)[None]).sum(-1)


def _int4_rows(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               mins: torch.Tensor) -> torch.Tensor:
    n, half = qweight.shape
    k = 2 * half
    g = k // scales.shape[1]
    if half % g == 0:
        return _int4_rows_by_group(x, qweight, scales, mins)
    scale = scales.float()[:, :, None].expand(n, k // g, g).reshape(n, k)
    low_min = mins.float()[:, :, None].expand(n, k // g, g).reshape(n, k)
    low = (qweight & 15).float() * scale[:, :half] + low_min[:, :half]
    high = (qweight >> 4).float() * scale[:, half:] + low_min[:, half:]
    xf = x.float()
    return (xf[:, None, :half] * low[None] + xf[:, None, half:] * high[None]).sum(-1)


def _int4_rows_by_group(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        mins: torch.Tensor) -> torch.Tensor:
    """``sum_g scale_g * (x_g . q_g) + sum_g min_g * sum(x_g)``: the minimums leave the
    inner loop (faster than applying them per weight: fewer multiplies per byte read).
    Needs whole groups in each half row (``K/2`` a multiple of the group)."""
    n, half = qweight.shape
    groups = scales.shape[1]
    g = 2 * half // groups
    m = x.shape[0]
    xf = x.float()
    low = (qweight & 15).view(n, groups // 2, g).float()
    high = (qweight >> 4).view(n, groups // 2, g).float()
    dot_low = (xf[:, :half].reshape(m, 1, groups // 2, g) * low[None]).sum(-1)
    dot_high = (xf[:, half:].reshape(m, 1, groups // 2, g) * high[None]).sum(-1)
    s = scales.float()
    x_sums = xf.reshape(m, groups, g).sum(-1)
    return ((dot_low * s[None, :, : groups // 2]).sum(-1)
            + (dot_high * s[None, :, groups // 2:]).sum(-1) + x_sums @ mins.float().t())


def _dequantize(qweight: torch.Tensor, scales: torch.Tensor,
                mins: torch.Tensor | None) -> torch.Tensor:
    n = qweight.shape[0]
    groups = scales.shape[1]
    if mins is None:
        values = qweight.float()
    else:
        values = torch.cat((qweight & 15, qweight >> 4), dim=-1).float()
    k = values.shape[1]
    grouped = values.reshape(n, groups, k // groups) * scales.float()[..., None]
    if mins is not None:
        grouped = grouped + mins.float()[..., None]
    return grouped.reshape(n, k)


def _allow_one_compile_per_shape() -> None:
    """Every weight shape (and row count up to ``DEQUANTIZE_ABOVE_ROWS``) gets its own
    static-shape kernel. Dynamo keys its cache on the Python function, which all shapes
    share: at its default limit of 8 entries the later shapes would silently run eagerly,
    and its automatic dynamic shapes would turn N and K symbolic, which makes inductor's
    loops far slower. So the limit is raised for this process."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)
    dynamo_config.accumulated_recompile_limit = max(
        dynamo_config.accumulated_recompile_limit, 1024)


def _default_cache_dir() -> None:
    """Keep inductor's artefacts beside kvrelay's other caches unless told otherwise."""
    root = Path(os.environ.get("KVRELAY_CACHE_DIR", "~/.cache/kvrelay")).expanduser()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))


def _kernel(kind: str, weight: QuantizedWeight) -> Kernel:
    key = (kind, weight.bits, weight.out_features, weight.in_features, weight.group_size)
    kernel = _compiled.get(key)
    if kernel is None:
        _default_cache_dir()
        body: Kernel = _dequantize
        if kind == "rows":
            body = _int8_rows if weight.bits == 8 else _int4_rows
        _allow_one_compile_per_shape()
        kernel = torch.compile(body, fullgraph=True, dynamic=False)
        _compiled[key] = kernel
    return kernel


def _dequantize_tiles_then_gemm(x: torch.Tensor, weight: QuantizedWeight,
                                 bias: torch.Tensor | None) -> torch.Tensor:
    """Many rows: dequantize ``TILE_ROWS`` output channels at a time into a float tile that
    stays in cache, and multiply it with the float GEMM; the whole float matrix never
    goes through memory."""
    xf = x.float()
    parts = []
    for start in range(0, weight.out_features, TILE_ROWS):
        rows = slice(start, start + TILE_ROWS)
        mins = None if weight.mins is None else weight.mins[rows]
        tile = QuantizedWeight(weight.qweight[rows], weight.scales[rows], mins, weight.bits,
                               weight.group_size, weight.in_features)
        parts.append(F.linear(xf, _kernel("dequantize", tile)(tile.qweight, tile.scales,
                                                              tile.mins)))
    out = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def quantized_matmul_cpu(x: torch.Tensor, weight: QuantizedWeight,
                         bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ dequantize(weight).T + bias`` (2-D ``x``), or None if compiling is impossible."""
    if _broken:
        return None
    try:
        if x.shape[0] > DEQUANTIZE_ABOVE_ROWS:
            return _dequantize_tiles_then_gemm(x, weight, bias)
        args = (weight.qweight, weight.scales) if weight.bits == 8 else (
            weight.qweight, weight.scales, weight.mins)
        out = _kernel("rows", weight)(x, *args)
    except Exception as exc:
        _broken.append(f"{type(exc).__name__}: {exc}")
        log.warning("compiling the quantized CPU matmul failed; using the (slower) reference "
                    "path from now on: %s", _broken[0][:500])
        return None
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
