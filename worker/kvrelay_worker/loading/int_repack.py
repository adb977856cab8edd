"""One layer of a compressed-tensors, GPTQ or AutoAWQ checkpoint repacked, exactly, into
``kvrelay_kernels.quantized_weight``'s layout (``prequantized_model`` streams the layers
through these):

- ``pack-quantized``: ``weight_packed`` int32 ``[N, ceil(K * bits / 32)]``, value ``i`` of a
  row in word ``i * bits // 32`` at bit ``i * bits % 32``, stored plus ``2**(bits-1)``
  (``u = q + 8`` for int4, ``q + 128`` for int8); ``weight_shape`` ``[N, K]``.
  ``naive-quantized``: ``weight`` int8 ``[N, K]``, the signed ``q`` itself.
- ``weight_scale`` ``[N, groups]`` (one column per channel), ``weight_zero_point`` (asymmetric
  only) signed, packed like the values but along the output dimension.
- ``w = (q - zp) * scale`` (``compressed_tensors...forward.dequantize``). For int4 with
  ``u = q + 8`` in 0..15 that is ``u * scale + min`` with ``min = -(zp + 8) * scale``
  (``-8 * scale`` when symmetric): the layout's int4 with minimums. int8 symmetric is
  ``q * scale``: the layout's int8; asymmetric int8 is ``q * scale + min`` with
  ``min = -zp * scale`` in float32 (the layout's int8 with minimums; one rounding more
  than ``(q - zp) * scale``, about 1e-7 relative).

GPTQ (``repack_gptq_layer``): ``qweight`` int32 ``[K * bits / 32, N]`` packed along the inputs,
``qzeros`` int32 ``[groups, N * bits / 32]`` along the outputs, ``scales`` ``[groups, N]``,
``g_idx`` ``[K]`` each input's group. Inputs are sorted by group (``desc_act`` scatters
them) and the layer gathers its activations in that order (``InputPermutedLinear``).

AutoAWQ's GEMM packing (``repack_awq_layer``): ``qweight`` int32 ``[K, N / 8]`` and ``qzeros``
int32 ``[groups, N / 8]`` both packed along the outputs, eight 4-bit values a word in AWQ's
interleaved order (the value at bits ``4 * i`` is output ``8 * word + [0, 2, 4, 6, 1, 3, 5,
7][i]``), ``scales`` ``[groups, N]``; ``w[n, i] = (q[i, n] - zero[g, n]) * scales[g, n]``
(GPTQModel's ``dequantize_gemm``, AutoAWQ's ``dequantize_gemm``): the layout's int4 with
``min = -zero * scale``, exact in float16 where it fits, else float32.

Groups: a stored group of ``G`` inputs whose ``K`` is not a multiple of it (llmcompressor's
default 128 on SmolLM2's 576) ends with a partial group. Our groups must divide ``K`` (and,
for the CPU kernels' int4 tiles, ``K / 2``), so each stored scale is repeated over the
smaller groups that tile it: ``g = gcd(G, K / 2)`` for int4, ``gcd(G, K)`` for int8 — the
same values at the same inputs, and no dequantisation. Scales stay float32 (or float16);
bfloat16 scales become float32 (exactly).
"""

from __future__ import annotations

import math

import torch

from kvrelay_kernels.quantized_weight import QuantizedWeight, pack_int4
from kvrelay_worker.loading.prequantized_config import WeightScheme
from kvrelay_worker.models.errors import UnsupportedModelError

PACKED_PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
                "weight_g_idx", "input_scale")
GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
AWQ_PARTS = ("qweight", "qzeros", "scales")
# AWQ's order of the eight 4-bit values in a word: the value at bits 4 * i is output
# 8 * word + _AWQ_ORDER[i]; reading position _AWQ_UNORDER[p] gives output 8 * word + p.
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_UNORDER = tuple(_AWQ_ORDER.index(p) for p in range(8))  # (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_int32(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """``[R, words]`` int32 -> ``[R, count]`` int32 stored values (still offset), along rows."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    values = (packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count]


def _unpack_rows(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """GPTQ's ``qweight``: ``[count * bits / 32, N]`` int32, packed along the inputs ->
    ``[count, N]`` values (input ``i`` at word ``i // (32 / bits)``, low bits first)."""
    return unpack_int32(packed.T.contiguous(), bits, count).T


def _float_scales(scales: torch.Tensor) -> torch.Tensor:
    """Stored scales as float16 or float32 (bfloat16 becomes float32, exactly)."""
    return scales if scales.dtype in (torch.float16, torch.float32) else scales.float()


def _minimum_dtype(scale: torch.Tensor, mins: torch.Tensor) -> torch.dtype:
    """The dtype scales and minimums share: the stored scales' where the (float64, exact)
    minimums fit it exactly, else float32."""
    return scale.dtype if torch.equal(mins.to(scale.dtype).double(), mins) else torch.float32


def _layout_group(stored: int, in_features: int, bits: int) -> int:
    return math.gcd(stored, in_features // 2 if bits == 4 else in_features)


def _spread(per_group: torch.Tensor, stored: int, group: int, in_features: int) -> torch.Tensor:
    """``[N, ceil(K / stored)]`` per stored group -> ``[N, K / group]`` per layout group."""
    repeated = per_group.repeat_interleave(stored // group, dim=1)
    return repeated[:, : in_features // group].contiguous()


def repack_layer(parts: dict[str, torch.Tensor], scheme: WeightScheme,
                 name: str) -> QuantizedWeight:
    """One compressed-tensors linear layer's tensors (keys: ``PACKED_PARTS`` or ``weight``)."""
    if "weight_g_idx" in parts:
        raise UnsupportedModelError(f"{name}: activation-ordered groups (weight_g_idx) are not "
                                    "supported")
    scale = _float_scales(parts["weight_scale"])
    if scale.dim() == 1:
        scale = scale[:, None]
    bits = scheme.bits
    if scheme.format == "pack-quantized":
        n, k = (int(v) for v in parts["weight_shape"].tolist())
        stored = unpack_int32(parts["weight_packed"], bits, k)
        signed = stored - (1 << (bits - 1))
    else:
        q = parts["weight"]
        if q.dtype != torch.int8:
            raise UnsupportedModelError(f"{name}: naive-quantized weight of dtype {q.dtype}")
        n, k = q.shape
        signed = q.to(torch.int32)
    if scale.shape[0] == 1 and n > 1:  # one scale for the tensor
        scale = scale.expand(n, scale.shape[1])
    stored_group = k if scheme.group_size is None else scheme.group_size
    if scale.shape != (n, math.ceil(k / stored_group)):
        raise UnsupportedModelError(f"{name}: weight_scale of shape {tuple(scale.shape)} for "
                                    f"a {n}x{k} weight in groups of {stored_group}")
    group = _layout_group(stored_group, k, bits)
    scales = _spread(scale, stored_group, group, k)
    if bits == 8 and scheme.symmetric:
        return QuantizedWeight(signed.to(torch.int8).contiguous(), scales, None, 8, group, k)
    zero = torch.zeros_like(scale, dtype=torch.int32)
    if not scheme.symmetric:
        packed_zp = parts.get("weight_zero_point")
        if packed_zp is None:
            raise UnsupportedModelError(f"{name}: asymmetric scheme without weight_zero_point")
        if scheme.format == "pack-quantized":
            zero = unpack_int32(packed_zp.T.contiguous(), bits, n).T - (1 << (bits - 1))
        else:
            zero = packed_zp.to(torch.int32)
        zero = zero.reshape(scale.shape)
    if bits == 8:  # w = q * scale + min, min = -zp * scale: int8 with minimums
        mins8 = -zero.double() * scale.double()
        return QuantizedWeight(signed.to(torch.int8).contiguous(), scales.float(),
                               _spread(mins8.float(), stored_group, group, k), 8, group, k)
    mins = -(zero + 8).double() * scale.double()  # exact: a 5-bit integer times the scale
    dtype = _minimum_dtype(scale, mins)
    values = (signed + 8).to(torch.uint8)
    return QuantizedWeight(pack_int4(values), scales.to(dtype),
                           _spread(mins.to(dtype), stored_group, group, k), 4, group, k)


def repack_gptq_layer(parts: dict[str, torch.Tensor], scheme: WeightScheme, name: str
                      ) -> tuple[QuantizedWeight, torch.Tensor | None]:
    """One GPTQ layer (``qweight``, ``qzeros``, ``scales``, ``g_idx``) and the input
    permutation that makes its groups contiguous (None when they already are).

    ``w[n, i] = scales[g, n] * (q[i, n] - zero[g, n])`` with ``g = g_idx[i]``
    (GPTQModel's ``dequantize_weight``); the ``gptq`` (v1) format stores ``zero - 1``.
    """
    bits = scheme.bits
    scales = _float_scales(parts["scales"])
    n = scales.shape[1]
    k = parts["qweight"].shape[0] * 32 // bits
    g_idx = parts.get("g_idx")
    if g_idx is None or g_idx.numel() != k:
        size = k if scheme.group_size is None else scheme.group_size
        g_idx = torch.arange(k) // size
    g_idx = g_idx.to(torch.long)
    q = _unpack_rows(parts["qweight"], bits, k)  # [K, N]
    zeros = unpack_int32(parts["qzeros"], bits, n)  # [groups, N]
    if scheme.format == "gptq":
        zeros = zeros + 1
    perm = torch.argsort(g_idx, stable=True)
    ordered = g_idx[perm]
    if torch.equal(perm, torch.arange(k)):
        perm_out: torch.Tensor | None = None
    else:
        perm_out = perm
        q = q[perm]
    counts = torch.bincount(ordered).tolist()
    group = math.gcd(k // 2 if bits == 4 else k, *[c for c in counts if c])
    block_group = ordered[::group]  # the stored group of each layout group
    if not torch.equal(ordered, block_group.repeat_interleave(group)):
        raise UnsupportedModelError(f"{name}: g_idx groups that no common group size tiles")
    layout_scales = scales[block_group].T.contiguous()  # [N, K / group]
    layout_zeros = zeros[block_group].T
    values = q.T.contiguous()  # [N, K]
    if bits == 8:
        if not bool((layout_zeros == 128).all()):
            raise UnsupportedModelError(f"{name}: 8-bit GPTQ zero points other than 128")
        signed = (values - 128).to(torch.int8).contiguous()
        return QuantizedWeight(signed, layout_scales, None, 8, group, k), perm_out
    mins = -layout_zeros.double() * layout_scales.double()
    dtype = _minimum_dtype(layout_scales, mins)
    return (QuantizedWeight(pack_int4(values.to(torch.uint8)), layout_scales.to(dtype),
                            mins.to(dtype).contiguous(), 4, group, k), perm_out)


def _unpack_awq(packed: torch.Tensor, count: int) -> torch.Tensor:
    """AWQ's ``[R, count / 8]`` int32 -> ``[R, count]`` 4-bit values in output order."""
    values = unpack_int32(packed, 4, packed.shape[1] * 8)
    ordered = values.reshape(packed.shape[0], -1, 8)[..., list(_AWQ_UNORDER)]
    return ordered.reshape(packed.shape[0], -1)[:, :count]


def repack_awq_layer(parts: dict[str, torch.Tensor], scheme: WeightScheme,
                     name: str) -> QuantizedWeight:
    """One AutoAWQ GEMM layer (``qweight``, ``qzeros``, ``scales``; see the module docstring)
    as the layout's int4: ``q * scale + min`` with ``min = -zero * scale``."""
    missing = [leaf for leaf in AWQ_PARTS if leaf not in parts]
    if missing:
        raise UnsupportedModelError(f"{name}: an AWQ layer without {', '.join(missing)}")
    scales = _float_scales(parts["scales"])
    qweight = parts["qweight"]
    k, n = qweight.shape[0], scales.shape[1]
    stored_group = k if scheme.group_size is None else scheme.group_size
    groups = math.ceil(k / stored_group)
    if (qweight.dtype != torch.int32 or qweight.shape[1] * 8 != n or k % 2
            or scales.shape[0] != groups or parts["qzeros"].shape != (groups, n // 8)):
        raise UnsupportedModelError(
            f"{name}: AWQ tensors qweight {tuple(qweight.shape)} {qweight.dtype}, qzeros "
            f"{tuple(parts['qzeros'].shape)}, scales {tuple(scales.shape)} do not make a "
            f"{n}x{k} weight in groups of {stored_group}")
    values = _unpack_awq(qweight, n).T.contiguous()  # [N, K]
    zeros = _unpack_awq(parts["qzeros"], n).T  # [N, groups]
    scale = scales.T.contiguous()  # [N, groups]
    group = _layout_group(stored_group, k, 4)
    mins = -zeros.double() * scale.double()  # exact: a 4-bit integer times the scale
    dtype = _minimum_dtype(scale, mins)
    return QuantizedWeight(pack_int4(values.to(torch.uint8)),
                           _spread(scale.to(dtype), stored_group, group, k),
                           _spread(mins.to(dtype), stored_group, group, k), 4, group, k)
