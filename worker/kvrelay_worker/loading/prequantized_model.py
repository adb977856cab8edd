"""Build a decoder from a compressed-tensors, GPTQ or AWQ checkpoint, its integer weights kept.

``prequantized_config`` decides which schemes are kept; here each quantized layer's tensors
(``compressed_tensors``' compressors write them) are repacked, exactly, into
``kvrelay_kernels.quantized_weight``'s layout:

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

FP8 (``float-quantized``: float8_e4m3fn ``weight``, ``weight_scale``, maybe ``input_scale``)
is repacked by ``fp8_repack`` onto ``kvrelay_kernels.fp8_weight`` (the bytes as stored)
and served by ``Fp8Linear``.

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
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from kvrelay_kernels.fp8_weight import Fp8Weight
from kvrelay_kernels.quantized_weight import QuantizedWeight, pack_int4
from kvrelay_worker.freed_memory import give_back_freed_memory
from kvrelay_worker.loading.fp8_repack import concat_fp8, repack_fp8_layer
from kvrelay_worker.loading.hf_folder import iter_safetensors_weights, load_order, read_hf_config
from kvrelay_worker.loading.prequantized_config import (
    AWQ_GEMM,
    GPTQ_FORMATS,
    PREQUANTIZED_KEY,
    Fp8Scheme,
    WeightScheme,
)
from kvrelay_worker.models.decoder import CausalLM, weight_target
from kvrelay_worker.models.errors import UnsupportedModelError
from kvrelay_worker.models.families import family_of
from kvrelay_worker.models.fp8_linear import Fp8Linear
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.permuted_linear import InputPermutedLinear
from kvrelay_worker.models.quantized_linear import QuantizedLinear

_PARTS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
          "weight_g_idx", "input_scale")
_GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
_AWQ_PARTS = ("qweight", "qzeros", "scales")
# AWQ's order of the eight 4-bit values in a word: the value at bits 4 * i is output
# 8 * word + _AWQ_ORDER[i]; reading position _AWQ_UNORDER[p] gives output 8 * word + p.
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_UNORDER = tuple(_AWQ_ORDER.index(p) for p in range(8))  # (0, 4, 1, 5, 2, 6, 3, 7)
_FUSED_SHARDS = {"qkv_proj": 3, "gate_up_proj": 2}


def unpack_int32(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """``[R, words]`` int32 -> ``[R, count]`` int32 stored values (still offset), along rows."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    values = (packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count]


def _layout_group(stored: int, in_features: int, bits: int) -> int:
    return math.gcd(stored, in_features // 2 if bits == 4 else in_features)


def _spread(per_group: torch.Tensor, stored: int, group: int, in_features: int) -> torch.Tensor:
    """``[N, ceil(K / stored)]`` per stored group -> ``[N, K / group]`` per layout group."""
    repeated = per_group.repeat_interleave(stored // group, dim=1)
    return repeated[:, : in_features // group].contiguous()


def repack_layer(parts: dict[str, torch.Tensor], scheme: WeightScheme,
                 name: str) -> QuantizedWeight:
    """One compressed-tensors linear layer's tensors (keys: ``_PARTS`` or ``weight``)."""
    if "weight_g_idx" in parts:
        raise UnsupportedModelError(f"{name}: activation-ordered groups (weight_g_idx) are not "
                                    "supported")
    scale = parts["weight_scale"]
    if scale.dtype not in (torch.float16, torch.float32):
        scale = scale.float()
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
    # scales and mins share a dtype: the stored one where the minimums fit it exactly
    dtype = scale.dtype if torch.equal(mins.to(scale.dtype).double(), mins) else torch.float32
    values = (signed + 8).to(torch.uint8)
    return QuantizedWeight(pack_int4(values), scales.to(dtype),
                           _spread(mins.to(dtype), stored_group, group, k), 4, group, k)


def _unpack_rows(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """GPTQ's ``qweight``: ``[count * bits / 32, N]`` int32, packed along the inputs ->
    ``[count, N]`` values (input ``i`` at word ``i // (32 / bits)``, low bits first)."""
    per_word = 32 // bits
    shifts = (torch.arange(per_word, dtype=torch.int32) * bits)[None, :, None]
    values = (packed.to(torch.int32)[:, None, :] >> shifts) & ((1 << bits) - 1)
    return values.reshape(-1, packed.shape[1])[:count]


def repack_gptq_layer(parts: dict[str, torch.Tensor], scheme: WeightScheme, name: str
                      ) -> tuple[QuantizedWeight, torch.Tensor | None]:
    """One GPTQ layer (``qweight``, ``qzeros``, ``scales``, ``g_idx``) and the input
    permutation that makes its groups contiguous (None when they already are).

    ``w[n, i] = scales[g, n] * (q[i, n] - zero[g, n])`` with ``g = g_idx[i]``
    (GPTQModel's ``dequantize_weight``); the ``gptq`` (v1) format stores ``zero - 1``.
    """
    bits = scheme.bits
    scales = parts["scales"]
    if scales.dtype not in (torch.float16, torch.float32):
        scales = scales.float()
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
    dtype = (layout_scales.dtype if torch.equal(mins.to(layout_scales.dtype).double(), mins)
             else torch.float32)
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
    missing = [leaf for leaf in _AWQ_PARTS if leaf not in parts]
    if missing:
        raise UnsupportedModelError(f"{name}: an AWQ layer without {', '.join(missing)}")
    scales = parts["scales"]
    if scales.dtype not in (torch.float16, torch.float32):
        scales = scales.float()
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
    dtype = scale.dtype if torch.equal(mins.to(scale.dtype).double(), mins) else torch.float32
    return QuantizedWeight(pack_int4(values.to(torch.uint8)),
                           _spread(scale.to(dtype), stored_group, group, k),
                           _spread(mins.to(dtype), stored_group, group, k), 4, group, k)


def _quantized_tensor(name: str, tensor: torch.Tensor) -> bool:
    """Whether a checkpoint tensor belongs to a quantized layer (else it loads as float)."""
    leaf = name.rpartition(".")[2]
    if (leaf in _PARTS or leaf in _GPTQ_PARTS or leaf in _AWQ_PARTS
            or (leaf == "weight" and tensor.dtype in (torch.int8, torch.float8_e4m3fn))):
        return True
    if leaf == "weight" and tensor.dtype.is_floating_point and tensor.element_size() == 1:
        raise UnsupportedModelError(f"{name}: {tensor.dtype} weights are not supported")
    return False


def _split(weights: Iterable[tuple[str, torch.Tensor]]
           ) -> tuple[dict[str, dict[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """Quantized layers' tensors by module name; every other tensor as it is (all at once:
    for tests and tools; the loader streams through ``_Repacker``)."""
    layers: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    floats: list[tuple[str, torch.Tensor]] = []
    for name, tensor in weights:
        if _quantized_tensor(name, tensor):
            module, _, leaf = name.rpartition(".")
            layers[module][leaf] = tensor
        else:
            floats.append((name, tensor))
    return layers, floats


class _Repacker:
    """Repacks quantized layers a decoder layer at a time as the weights stream in, so a
    load holds the kept matrices plus one layer's stored tensors, never all of them."""

    def __init__(self, scheme: WeightScheme | Fp8Scheme) -> None:
        self.scheme = scheme
        self.pending: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        self.shards: dict[str, dict[int | None, QuantizedWeight | Fp8Weight]] = defaultdict(dict)
        self.orders: dict[str, dict[int | None, torch.Tensor | None]] = defaultdict(dict)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        module, _, leaf = name.rpartition(".")
        self.pending[module][leaf] = tensor

    def flush(self) -> None:
        """Repack every module whose tensors have all come (the previous layer's)."""
        for module, parts in self.pending.items():
            target = weight_target(f"{module}.weight".removeprefix("model."))
            path = target.param.removesuffix(".weight")
            if target.expert is not None or path in ("embed_tokens", "lm_head"):
                raise UnsupportedModelError(f"{module}: quantized {path} is not supported")
            matrix: QuantizedWeight | Fp8Weight
            if isinstance(self.scheme, Fp8Scheme):
                matrix, order = repack_fp8_layer(parts, self.scheme, module), None
            elif self.scheme.format in GPTQ_FORMATS:
                matrix, order = repack_gptq_layer(parts, self.scheme, module)
            elif self.scheme.format == AWQ_GEMM:
                matrix, order = repack_awq_layer(parts, self.scheme, module), None
            else:
                matrix, order = repack_layer(parts, self.scheme, module), None
            self.shards[path][target.shard] = matrix
            self.orders[path][target.shard] = order
        self.pending.clear()
        give_back_freed_memory()


def _concat(parts: list[QuantizedWeight | Fp8Weight], path: str
            ) -> QuantizedWeight | Fp8Weight:
    fp8 = [p for p in parts if isinstance(p, Fp8Weight)]
    if fp8:
        if len(fp8) != len(parts):
            raise UnsupportedModelError(f"{path}: its shards are quantized differently")
        return concat_fp8(fp8, path)
    ints = [p for p in parts if isinstance(p, QuantizedWeight)]
    return _concat_int(ints, path)


def _concat_int(parts: list[QuantizedWeight], path: str) -> QuantizedWeight:
    first = parts[0]
    for p in parts[1:]:
        if (p.bits, p.group_size, p.in_features, p.scales.dtype) != (
                first.bits, first.group_size, first.in_features, first.scales.dtype):
            raise UnsupportedModelError(f"{path}: its shards are quantized differently")
    mins = None if first.mins is None else torch.cat([p.mins for p in parts if p.mins is not None])
    return QuantizedWeight(torch.cat([p.qweight for p in parts]).contiguous(),
                           torch.cat([p.scales for p in parts]).contiguous(), mins, first.bits,
                           first.group_size, first.in_features)


def build_prequantized_model(folder: Path, dtype: torch.dtype, device: torch.device,
                             max_position: int, config: ModelConfig | None = None, *,
                             progress: bool = False) -> CausalLM:
    """The decoder with each quantized linear layer a ``QuantizedLinear`` (``Fp8Linear`` for
    FP8), as stored.

    Layers the checkpoint left float (its ``ignore`` list: ``lm_head``, and others), the
    embeddings, norms and biases load through ``load_weights`` as on the float path.
    """
    config = config if config is not None else read_hf_config(folder)
    scheme = config.extra.get(PREQUANTIZED_KEY)
    if not isinstance(scheme, (WeightScheme, Fp8Scheme)):
        raise UnsupportedModelError(f"{folder}: not a pre-quantized checkpoint")
    family_of(config.model_type)
    repacker = _Repacker(scheme)
    floats: list[tuple[str, torch.Tensor]] = []
    part: tuple[int, int] | None = None
    for name, tensor in iter_safetensors_weights(folder, config, progress=progress):
        if load_order(name) != part:  # the weights come a part (a layer) at a time
            repacker.flush()
            part = load_order(name)
        if _quantized_tensor(name, tensor):
            repacker.add(name, tensor)
            continue
        if tensor.dim() >= 2 and tensor.is_floating_point() and device.type == "cpu":
            # In the model's dtype now, so it becomes the parameter without a second copy
            # (matrices only: a norm's offset is added before any rounding).
            tensor = tensor.to(dtype)
        floats.append((name, tensor))
    repacker.flush()
    with torch.device("meta"):
        model = CausalLM(config, max_position=max_position)
    modules = dict(model.named_modules())
    quantized: dict[str, QuantizedWeight | Fp8Weight] = {}
    permutations: dict[str, torch.Tensor | None] = {}
    for path in list(repacker.shards):
        by_shard = repacker.shards.pop(path)
        linear = modules.get(path)
        if not isinstance(linear, nn.Linear):
            raise UnsupportedModelError(f"{path}: no linear layer of that name")
        leaf = path.rpartition(".")[2]
        expected = _FUSED_SHARDS.get(leaf, 1) if None not in by_shard else 1
        if len(by_shard) != expected:
            raise UnsupportedModelError(f"{path}: only some of its {expected} projections are "
                                        "quantized; mixed float/quantized fused layers are not "
                                        "supported")
        quantized[path] = _concat([by_shard[i] for i in sorted(by_shard, key=lambda i: i or 0)],
                                  path)
        permutations[path] = _one_order(list(repacker.orders[path].values()), path)
    biased = {path: modules[path].bias is not None for path in quantized}
    model.place_rotary_tables(device)
    for path, matrix in quantized.items():
        zeros = (torch.zeros(matrix.out_features, dtype=dtype, device=device)
                 if biased[path] else None)
        layer: nn.Module = (Fp8Linear(matrix.to(device), zeros)
                            if isinstance(matrix, Fp8Weight)
                            else QuantizedLinear(matrix.to(device), zeros))
        _set_module(model, path, layer)
    # Float weights placed as they are copied in (fresh reads in the model's dtype are
    # kept as they are): never a second copy of the embedding table.
    model.load_weights(floats, place=(device, dtype), adopt=True)
    for path, order in permutations.items():  # after the biases are loaded by name
        if order is not None:
            _set_module(model, path, InputPermutedLinear(model.get_submodule(path),
                                                         order.to(device)))
    return model.eval()


def _one_order(orders: list[torch.Tensor | None], path: str) -> torch.Tensor | None:
    """The input order the shards of one fused layer share (they read the same input)."""
    first = orders[0]
    for other in orders[1:]:
        if (other is None) != (first is None) or (
                other is not None and first is not None and not torch.equal(other, first)):
            raise UnsupportedModelError(f"{path}: its projections order their inputs "
                                        "differently (GPTQ act order); not supported")
    return first


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, leaf, module)
