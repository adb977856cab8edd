"""Build a decoder straight from a GGUF file, its quantized blocks kept as stored.

The float path converts a GGUF once into float32 safetensors (``model_cache``): SmolLM2's
93 MB Q4_1 file becomes 538 MB of weights. With ``quantization="gguf"`` the engine instead
reads the quantized tensors from the GGUF file itself at load (one at a time: no second
copy on disk) and repacks Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K blocks losslessly
(``gguf_blocks``; other quantized types are requantized, and ``formats`` says which);
norms and biases, stored float, are loaded as usual. Config and tokenizer still come from the
prepared cache folder, so ``kvrelay models prepare`` and the float path are unchanged.

Fused projections (q/k/v, gate/up) concatenate their shards' rows when the shards share a
layout (one ``QuantizedLinear``). Files that mix types within one fused layer (a Q6_K
``attn_v`` beside Q4_K ``attn_q``/``attn_k``, as ``Q4_K_M`` files do in some layers) keep
every shard as stored too: consecutive shards of one layout are concatenated and the layer
becomes a ``FusedQuantizedLinear`` of those parts, each multiplied on its own kept weight.
Only a float-stored shard beside quantized ones (rare) gets its layer requantized from
float, in the format of its first quantized shard (the load log warns). llama.cpp's q/k row
permutation is undone on the packed rows. Phi-3's fused ``attn_qkv``/``ffn_up`` are our
``qkv_proj``/``gate_up_proj`` as stored: kept whole.

Mixture-of-experts layers (Mixtral, Qwen3-MoE) keep their experts too: each expert's slice
of the stacked ``ffn_*_exps`` tensors is repacked like any matrix, gate|up joined as for a
dense MLP, and ``SparseMoE.keep_quantized`` runs them one expert at a time. A layer with
any expert stored as floats loads all its experts into the float stacks.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from kvrelay_kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from kvrelay_worker.freed_memory import give_back_freed_memory
from kvrelay_worker.loading.gguf_blocks import FLOAT_TYPES, repack_blocks, requantize
from kvrelay_worker.loading.gguf_file import GGUFCheckpoint, GGUFTensorSpec
from kvrelay_worker.loading.load_progress import LoadProgress
from kvrelay_worker.models.allocate import allocate
from kvrelay_worker.models.decoder import CausalLM, weight_target
from kvrelay_worker.models.families import family_of
from kvrelay_worker.models.moe import SparseMoE
from kvrelay_worker.models.quantized_linear import (
    FusedQuantizedLinear,
    QuantizedEmbedding,
    QuantizedLinear,
)

log = logging.getLogger(__name__)

_MATRIX_SUFFIXES = ("_proj.weight",)
_EMBED = "embed_tokens"


@dataclass
class StoredFormat:
    """How one matrix came out of the file: repacked losslessly, requantized, or float."""

    gguf_type: str
    # "repacked", "requantized", "float", or "requantized (fused with another type)": a
    # quantized shard of a fused layer that also has a float-stored shard
    how: str


def _module_path(spec: GGUFTensorSpec) -> tuple[str, int | None] | None:
    """Which of our modules a GGUF matrix fills (and as which shard), or None."""
    name = spec.name.removeprefix("model.")
    if name == "embed_tokens.weight":
        return _EMBED, None
    if name == "lm_head.weight":
        return "lm_head", None
    if not name.endswith(_MATRIX_SUFFIXES) or spec.expert is not None:
        return None
    target = weight_target(name)
    return target.param.removesuffix(".weight"), target.shard


class GGUFQuantizedLoader:
    """Reads one GGUF's matrices as ``QuantizedWeight`` s, rows in Hugging Face order."""

    def __init__(self, checkpoint: GGUFCheckpoint) -> None:
        self.checkpoint = checkpoint
        self.formats: dict[str, StoredFormat] = {}

    def matrix(self, spec: GGUFTensorSpec) -> QuantizedWeight | torch.Tensor:
        """Repacked blocks, or float32 values for float-stored and non-repackable types."""
        tensor = self.checkpoint.raw_tensor(spec)
        if spec.gguf_type in FLOAT_TYPES:
            self.formats[spec.name] = StoredFormat(spec.gguf_type, "float")
            return self.checkpoint.load_tensor(spec)
        data = tensor.data if spec.expert is None else tensor.slab(spec.expert)
        packed = repack_blocks(data, tensor.tensor_type, spec.shape[1])
        if packed is None:
            self.formats[spec.name] = StoredFormat(spec.gguf_type, "requantized")
            return requantize(self.checkpoint.load_tensor(spec), tensor.tensor_type)
        self.formats[spec.name] = StoredFormat(spec.gguf_type, "repacked")
        order = self.checkpoint.rotary_row_order(spec)
        return packed if order is None else packed.rows(order)


def _same_format(parts: list[QuantizedWeight]) -> bool:
    first = parts[0]
    return all(p.bits == first.bits and p.group_size == first.group_size
               and p.scales.dtype == first.scales.dtype
               and (p.mins is None) == (first.mins is None)
               and (p.mins is None or first.mins is None or p.mins.dtype == first.mins.dtype)
               for p in parts)


def _concat(parts: list[QuantizedWeight]) -> QuantizedWeight:
    first = parts[0]
    mins = None if first.mins is None else torch.cat([p.mins for p in parts if p.mins is not None])
    return QuantizedWeight(torch.cat([p.qweight for p in parts]),
                           torch.cat([p.scales for p in parts]), mins, first.bits,
                           first.group_size, first.in_features)


def _as_float(part: QuantizedWeight | torch.Tensor) -> torch.Tensor:
    from kvrelay_kernels.reference.quantized_matmul import dequantize_weight

    return part if isinstance(part, torch.Tensor) else dequantize_weight(part)


def _runs(parts: list[QuantizedWeight]) -> list[QuantizedWeight]:
    """Consecutive shards of one layout concatenated: the kept matrices of a fused layer
    (one when every shard shares a layout; q|k and v for a ``Q4_K_M`` file's mixed q/k/v)."""
    runs: list[list[QuantizedWeight]] = []
    for part in parts:
        if runs and _same_format([runs[-1][0], part]):
            runs[-1].append(part)
        else:
            runs.append([part])
    return [run[0] if len(run) == 1 else _concat(run) for run in runs]


def _fused(parts: list[QuantizedWeight | torch.Tensor], path: str
           ) -> QuantizedWeight | list[QuantizedWeight] | torch.Tensor:
    """One matrix from its shards, kept quantized when they share a layout; several (one
    per run of a layout) when they do not; requantized only when a float shard is among
    quantized ones."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat([p for p in parts if isinstance(p, torch.Tensor)])
    quantized = [p for p in parts if isinstance(p, QuantizedWeight)]
    if len(quantized) == len(parts):
        runs = _runs(quantized)
        return runs[0] if len(runs) == 1 else runs
    first = quantized[0]
    values = torch.cat([_as_float(p) for p in parts])
    log.warning("%s: a float shard beside quantized ones; requantized from float as int%d",
                path, first.bits)
    if first.bits == 8:
        return quantize_int8(values)
    return quantize_int4(values, first.group_size)


def _spec_bytes(checkpoint: GGUFCheckpoint, spec: GGUFTensorSpec) -> int:
    """Bytes of the file one weight reads (one expert's share of a stacked tensor)."""
    raw = checkpoint.raw_tensor(spec)
    return raw.n_bytes if spec.expert is None else raw.n_bytes // int(raw.shape[-1])


def _shard_count(path: str) -> int:
    """How many file matrices fill one of our modules (fused q/k/v and gate/up)."""
    if path.endswith("qkv_proj"):
        return 3
    return 2 if path.endswith("gate_up_proj") else 1


def _settle(path: str, parts: dict[int | None, tuple[str, QuantizedWeight | torch.Tensor]],
            loader: GGUFQuantizedLoader, floats: list[tuple[str, torch.Tensor]],
            quantized: dict[str, QuantizedWeight | list[QuantizedWeight]]) -> None:
    """Place one module's shards: float ones with the float weights, else one kept matrix
    (or one per layout) in ``quantized``."""
    ordered = [parts[key] for key in sorted(parts, key=lambda k: k or 0)]
    if all(isinstance(value, torch.Tensor) for _, value in ordered):
        floats.extend((name, value) for name, value in ordered
                      if isinstance(value, torch.Tensor))
        return
    matrix = _fused([value for _, value in ordered], path)
    if any(isinstance(value, torch.Tensor) for _, value in ordered):
        for name, _ in ordered:  # a float shard among them: the layer was requantized
            if name in loader.formats and loader.formats[name].how == "repacked":
                loader.formats[name].how = "requantized (fused with another type)"
    assert not isinstance(matrix, torch.Tensor)
    quantized[path] = matrix


def build_gguf_quantized_model(checkpoint: GGUFCheckpoint, dtype: torch.dtype,
                               device: torch.device, max_position: int, *,
                               progress: bool = False
                               ) -> tuple[CausalLM, dict[str, StoredFormat]]:
    """The decoder with every matrix as stored in the file; also each matrix's format.

    Float-stored matrices (and every norm and bias) load through ``load_weights`` as on
    the float path; quantized ones replace their ``nn.Linear`` (or embedding) module.
    """
    specs = checkpoint.tensor_specs()
    total = sum(_spec_bytes(checkpoint, spec) for spec in specs)
    with LoadProgress(total, checkpoint.path.name, progress=progress) as bar:
        return _build(checkpoint, specs, dtype, device, max_position, bar)


def _build(checkpoint: GGUFCheckpoint, specs: list[GGUFTensorSpec], dtype: torch.dtype,
           device: torch.device, max_position: int, bar: LoadProgress
           ) -> tuple[CausalLM, dict[str, StoredFormat]]:
    config = checkpoint.config
    family_of(config.model_type)
    loader = GGUFQuantizedLoader(checkpoint)
    shards: dict[str, dict[int | None, tuple[str, QuantizedWeight | torch.Tensor]]] = (
        defaultdict(dict))
    floats: list[tuple[str, torch.Tensor]] = []
    quantized: dict[str, QuantizedWeight | list[QuantizedWeight]] = {}
    # MoE layer path -> expert -> (gate, up, down) specs, read once the model exists
    experts: dict[str, dict[int, dict[int, GGUFTensorSpec]]] = defaultdict(
        lambda: defaultdict(dict))
    float_expert_layers = {_expert_slot(s)[0] for s in specs
                           if s.expert is not None and s.gguf_type in FLOAT_TYPES}
    for spec in specs:
        where = _module_path(spec)
        if spec.expert is not None and _expert_slot(spec)[0] not in float_expert_layers:
            layer, slot = _expert_slot(spec)
            experts[layer][spec.expert][slot] = spec
            continue  # counted in the progress when read
        if where is None:
            floats.append((spec.name, checkpoint.load_tensor(spec)))
        else:
            shards[where[0]][where[1]] = (spec.name, loader.matrix(spec))
            if len(shards[where[0]]) == _shard_count(where[0]):
                # Fused now, its shards let go: never every layer's shards at once.
                _settle(where[0], shards.pop(where[0]), loader, floats, quantized)
                give_back_freed_memory()
        bar.advance(_spec_bytes(checkpoint, spec))
    for path, parts in shards.items():
        _settle(path, parts, loader, floats, quantized)
    with torch.device("meta"):
        model = CausalLM(config, max_position=max_position)
    biased = {name: getattr(module, "bias", None) is not None
              for name, module in model.named_modules()}
    for path in quantized:
        _set_module(model, path, nn.Identity())
    for path in experts:  # no float stacks for kept experts
        moe = model.get_submodule(path)
        del moe._parameters["w13"], moe._parameters["w2"]
    tied_quantized = config.tie_word_embeddings and _EMBED in quantized
    if tied_quantized:
        _set_module(model, "lm_head", nn.Identity())
    model = allocate(model, device, dtype)
    model.place_rotary_tables(device)
    if config.tie_word_embeddings and not tied_quantized:
        model.lm_head.weight = model.embed_tokens.weight
    for path, matrix in quantized.items():
        if isinstance(matrix, list):  # shards of different layouts: one part per layout
            width = sum(part.out_features for part in matrix)
            zeros = (torch.zeros(width, dtype=dtype, device=device)
                     if biased.get(path, False) else None)
            _set_module(model, path,
                        FusedQuantizedLinear([part.to(device) for part in matrix], zeros))
            continue
        bias = biased.get(path, False)
        zeros = torch.zeros(matrix.out_features, dtype=dtype, device=device) if bias else None
        module = QuantizedLinear(matrix.to(device), zeros)
        if path == _EMBED:
            model.embed_tokens = QuantizedEmbedding(module, dtype)  # type: ignore[assignment]
            if tied_quantized:
                model.lm_head = module  # type: ignore[assignment]
        else:
            _set_module(model, path, module)
    for path, by_expert in experts.items():
        w13, w2 = _expert_modules(loader, by_expert, path, device, bar)
        moe = model.get_submodule(path)
        assert isinstance(moe, SparseMoE)
        moe.keep_quantized(w13, w2)
    model.load_weights(floats)
    return model.eval(), loader.formats


def _expert_slot(spec: GGUFTensorSpec) -> tuple[str, int]:
    """``(MoE layer path, 0 gate / 1 up / 2 down)`` of one expert's matrix."""
    target = weight_target(spec.name.removeprefix("model."))  # into w13 or w2
    layer, stack = target.param.rsplit(".", 1)
    return layer, 2 if stack == "w2" else target.shard or 0


def _linear(matrix: QuantizedWeight | list[QuantizedWeight] | torch.Tensor,
            device: torch.device) -> nn.Module:
    if isinstance(matrix, list):
        return FusedQuantizedLinear([part.to(device) for part in matrix], None)
    assert not isinstance(matrix, torch.Tensor)
    return QuantizedLinear(matrix.to(device))


def _expert_modules(loader: GGUFQuantizedLoader,
                    by_expert: dict[int, dict[int, GGUFTensorSpec]], path: str,
                    device: torch.device, bar: LoadProgress
                    ) -> tuple[list[nn.Module], list[nn.Module]]:
    """Each expert's gate|up and down as kept matrices, in expert order."""
    w13: list[nn.Module] = []
    w2: list[nn.Module] = []
    for expert in sorted(by_expert):
        gate, up, down = (loader.matrix(by_expert[expert][part]) for part in range(3))
        w13.append(_linear(_fused([gate, up], f"{path}.experts.{expert}"), device))
        w2.append(_linear(down, device))
        bar.advance(sum(_spec_bytes(loader.checkpoint, spec)
                        for spec in by_expert[expert].values()))
    give_back_freed_memory()
    return w13, w2


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, leaf, module)
