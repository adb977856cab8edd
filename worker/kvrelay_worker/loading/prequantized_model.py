"""Build a decoder from a pre-quantized checkpoint, its quantized weights kept as stored.

``prequantized_config`` decides which schemes are kept. The weights stream in a decoder
layer at a time (``iter_safetensors_weights``); each layer's quantized projections are
repacked as soon as the next layer starts arriving — integer schemes (compressed-tensors,
GPTQ, AutoAWQ) by ``int_repack`` onto ``kvrelay_kernels.quantized_weight``'s layout, FP8 by
``fp8_repack`` onto ``kvrelay_kernels.fp8_weight`` (served by ``Fp8Linear``) — so a load
holds the kept matrices plus one layer's stored tensors. Fused q/k/v and gate/up shards
are concatenated; GPTQ's activation order becomes an ``InputPermutedLinear``. Float
tensors (embeddings, norms, biases, layers the checkpoint left float) load through
``load_weights``, adopted without a copy when already in the model's dtype.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from kvrelay_kernels.fp8_weight import Fp8Weight
from kvrelay_kernels.quantized_weight import QuantizedWeight
from kvrelay_worker.freed_memory import give_back_freed_memory
from kvrelay_worker.loading.fp8_repack import concat_fp8, repack_fp8_layer
from kvrelay_worker.loading.hf_folder import iter_safetensors_weights, load_order, read_hf_config
from kvrelay_worker.loading.int_repack import (
    AWQ_PARTS,
    GPTQ_PARTS,
    PACKED_PARTS,
    repack_awq_layer,
    repack_gptq_layer,
    repack_layer,
)
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

_FUSED_SHARDS = {"qkv_proj": 3, "gate_up_proj": 2}


def _quantized_tensor(name: str, tensor: torch.Tensor) -> bool:
    """Whether a checkpoint tensor belongs to a quantized layer (else it loads as float)."""
    leaf = name.rpartition(".")[2]
    if (leaf in PACKED_PARTS or leaf in GPTQ_PARTS or leaf in AWQ_PARTS
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
