"""The decoder every family shares: embeddings, a stack of layers, final norm, LM head.

A family chooses the layer shape (``PreNormLayer`` or ``SandwichNormLayer``) and sets the
``ModelConfig`` switches; this class does the rest: per-layer RoPE tables, Gemma's
embedding scale and final-logit soft-capping, and loading Hugging Face checkpoints,
whose per-projection and per-expert tensors it fuses into our layout as they stream in
(q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj``, experts into stacked ``w13``/``w2``).
The model takes a flattened batch (no padding) and knows nothing about blocks: attention
goes through ``Attention`` and the metadata the runner built.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from kvrelay_worker.models.attention import Attention, AttentionMetadata
from kvrelay_worker.models.cpu_linear import Linear
from kvrelay_worker.models.decoder_layers import PreNormLayer, SandwichNormLayer
from kvrelay_worker.models.layers import RMSNorm
from kvrelay_worker.models.model_config import ModelConfig
from kvrelay_worker.models.rotary import build_cos_sin_cache

DecoderLayer = PreNormLayer | SandwichNormLayer

# Checkpoint projection name -> (our fused parameter, shard index within it).
_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# One expert's tensors, in Mixtral's (w1/w3/w2) or Qwen-MoE's (gate/up/down) spelling.
_EXPERT = re.compile(r"^(.*)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_TARGET = {"w1": ("w13", 0), "gate_proj": ("w13", 0), "w3": ("w13", 1),
                  "up_proj": ("w13", 1), "w2": ("w2", None), "down_proj": ("w2", None)}
# transformers 5 may save experts already stacked.
_STACKED_EXPERTS = {"experts.gate_up_proj": "w13", "experts.down_proj": "w2"}


class WeightTarget:
    """Where one checkpoint tensor goes: a parameter, maybe one expert, maybe one shard."""

    __slots__ = ("expert", "param", "shard")

    def __init__(self, param: str, expert: int | None = None, shard: int | None = None) -> None:
        self.param = param
        self.expert = expert
        self.shard = shard

    @property
    def key(self) -> str:
        return f"{self.param}#{self.expert}#{self.shard}"


def weight_target(name: str) -> WeightTarget:
    """Map a Hugging Face tensor name (``model.`` prefix removed) to our parameter."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    expert = _EXPERT.match(name)
    if expert is not None:
        param, shard = _EXPERT_TARGET[expert.group(3)]
        return WeightTarget(f"{expert.group(1)}.{param}", int(expert.group(2)), shard)
    for stacked, param in _STACKED_EXPERTS.items():
        if name.endswith(f".{stacked}"):
            return WeightTarget(f"{name.removesuffix(stacked)}{param}")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _SHARDS:
        fused, shard = _SHARDS[parts[-2]]
        return WeightTarget(".".join([*parts[:-2], fused, parts[-1]]), shard=shard)
    return WeightTarget(name)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.max_position = max_position or config.max_position_embeddings
        layer_class = SandwichNormLayer if config.sandwich_norms else PreNormLayer
        # Plain attributes, not buffers: tables stay float32 whatever dtype the model takes.
        self.rotary_tables = self._rotary_tables(None)
        # Given an empty weight, not initialised: every weight is loaded or drawn later, and
        # a random init on ``meta`` runs through PyTorch's reference ops, which import
        # ``torch._dynamo`` (seconds at every worker start).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size,
                                                             config.hidden_size))
        self.layers = nn.ModuleList(
            layer_class(config, i, self.rotary_tables[i]) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def _rope_of_layer(self, layer: int) -> tuple[float, dict[str, Any] | None]:
        """Gemma 3's windowed layers rotate with their own base and no scaling."""
        cfg = self.config
        if cfg.local_rope_theta is not None and cfg.window_of(layer) is not None:
            return cfg.local_rope_theta, None
        return cfg.rope_theta, cfg.rope_scaling

    def _rotary_tables(self, device: torch.device | None) -> list[torch.Tensor]:
        """One cos/sin table per layer; layers with the same RoPE share one tensor."""
        built: dict[str, torch.Tensor] = {}
        tables = []
        for layer in range(self.config.num_hidden_layers):
            theta, scaling = self._rope_of_layer(layer)
            key = repr((theta, sorted((scaling or {}).items())))
            if key not in built:
                built[key] = build_cos_sin_cache(self.config.head_dim, theta, scaling,
                                                 self.max_position, device)
            tables.append(built[key])
        return tables

    def place_rotary_tables(self, device: torch.device) -> None:
        """Build the RoPE tables (float32) on ``device`` and install them in every layer."""
        self.rotary_tables = self._rotary_tables(device)
        for layer, table in zip(self.decoder_layers(), self.rotary_tables, strict=True):
            layer.self_attn.cos_sin_cache = table

    def decoder_layers(self) -> list[DecoderLayer]:
        layers: list[DecoderLayer] = []
        for layer in self.layers:
            assert isinstance(layer, (PreNormLayer, SandwichNormLayer))
            layers.append(layer)
        return layers

    @property
    def has_experts(self) -> bool:
        return any(self.config.moe_layers)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.decoder_layers()]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states after the final norm, ``[num_tokens, hidden_size]``."""
        hidden = self.embed_tokens(input_ids)
        if self.config.embedding_multiplier is not None:
            # As Gemma does: the multiplier rounded to the activations' dtype first.
            hidden = hidden * torch.tensor(self.config.embedding_multiplier, dtype=hidden.dtype)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                     place: tuple[torch.device, torch.dtype] | None = None,
                     on_part_loaded: Callable[[str], None] | None = None,
                     adopt: bool = False) -> None:
        """Copy Hugging Face-named tensors in, fusing projections and experts as they come.

        A model built on ``meta`` is given storage one parameter at a time as its first
        tensor arrives (``place``: device and floating dtype), and ``on_part_loaded`` hears
        of each part (``embed_tokens``, ``layers.3``, ``norm``, ``lm_head``) once all its
        parameters are filled: a loader can quantize it or move it then, so peak memory is
        the weights kept plus one part in float, not the whole model in float. With
        ``adopt`` the tensors are the caller's to give (fresh reads, nothing else holds
        them): one that fills a whole ``meta`` parameter in its final dtype and device
        becomes that parameter, with no copy.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        offset = self.config.norm_weight_offset
        parts = _parameters_by_part(params)
        done_parts: set[str] = set()
        released: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target = weight_target(name)
            if target.param in released:
                raise ValueError(f"checkpoint tensor {name!r} comes again after its part "
                                 "was complete")
            if target.param not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no place in the model")
            whole = target.expert is None and target.shard is None
            if params[target.param].is_meta and place is not None:
                keep = (adopt and whole and not (offset and name.endswith("norm.weight"))
                        and tensor.dtype == place[1] and tensor.device == place[0]
                        and tensor.is_contiguous() and tensor.shape == params[target.param].shape)
                params[target.param] = self._place(target.param, *place,
                                                   tensor if keep else None)
                if keep:
                    loaded.add(target.key)
                    del tensor
                    self._part_done(target.param, parts, params, released, loaded,
                                    done_parts, on_part_loaded)
                    continue
            dest = params[target.param].data
            if target.expert is not None:
                dest = dest[target.expert]
            if target.shard is not None:
                sizes = self._shard_sizes(target.param)
                start = sum(sizes[: target.shard])
                dest = dest[start : start + sizes[target.shard]]
            if dest.shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model "
                                 f"{tuple(dest.shape)}")
            if offset and name.endswith("norm.weight"):
                tensor = tensor.float() + offset  # Gemma stores norm weights minus one
            dest.copy_(tensor)
            del tensor  # the read buffer goes before the next tensor is read
            loaded.add(target.key)
            self._part_done(target.param, parts, params, released, loaded, done_parts,
                            on_part_loaded)
        self._check_complete([*params, *released], loaded)

    def _part_done(self, param: str, parts: dict[str, list[str]],
                   params: dict[str, nn.Parameter], released: set[str],
                   loaded: set[str], done_parts: set[str],
                   on_part_loaded: Callable[[str], None] | None) -> None:
        """Tell ``on_part_loaded`` once ``param``'s part is whole, letting its parameters go
        from the loader's own table (the listener may replace them)."""
        part = _part_of(param)
        if (on_part_loaded is None or part in done_parts
                or not all(self._is_complete(p, loaded) for p in parts[part])):
            return
        done_parts.add(part)
        for name in parts[part]:
            params.pop(name)
            released.add(name)
        on_part_loaded(part)

    def _place(self, param: str, device: torch.device, dtype: torch.dtype,
               tensor: torch.Tensor | None = None) -> nn.Parameter:
        """Give one ``meta`` parameter storage (``tensor`` itself, or uninitialised); re-tie
        the LM head to a placed embedding table."""
        owner_path, _, leaf = param.rpartition(".")
        owner = self.get_submodule(owner_path) if owner_path else self
        old = getattr(owner, leaf)
        kind = dtype if old.is_floating_point() else old.dtype
        storage = tensor if tensor is not None else torch.empty(old.shape, dtype=kind,
                                                                device=device)
        fresh = nn.Parameter(storage, requires_grad=old.requires_grad)
        setattr(owner, leaf, fresh)
        if param == "embed_tokens.weight" and self.config.tie_word_embeddings:
            self.lm_head.weight = fresh
        return fresh

    def _shard_sizes(self, param: str) -> list[int]:
        cfg = self.config
        owner, leaf = param.rsplit(".", 2)[-2:]
        if leaf == "w13":
            return [cfg.moe_intermediate_size] * 2  # every expert's gate rows, then up
        if owner == "qkv_proj":
            return [cfg.q_size, cfg.kv_size, cfg.kv_size]
        return [cfg.intermediate_size] * 2  # gate_up_proj

    def _is_complete(self, name: str, loaded: set[str]) -> bool:
        """Whether parameter ``name`` was filled: whole, or by every shard / expert."""
        if f"{name}#None#None" in loaded:
            return True
        owner, leaf = name.rsplit(".", 2)[-2:]
        if owner in ("qkv_proj", "gate_up_proj"):
            shards = 3 if owner == "qkv_proj" else 2
            return all(f"{name}#None#{i}" in loaded for i in range(shards))
        if leaf in ("w13", "w2"):
            parts: tuple[int | None, ...] = (0, 1) if leaf == "w13" else (None,)
            return all(f"{name}#{e}#{p}" in loaded
                       for e in range(self.config.num_experts) for p in parts)
        return False

    def _check_complete(self, params: Iterable[str], loaded: set[str]) -> None:
        missing = [
            name for name in params
            if not (name == "lm_head.weight" and self.config.tie_word_embeddings)
            and not self._is_complete(name, loaded)
        ]
        if missing:
            raise ValueError(f"checkpoint is missing weights: {', '.join(missing[:8])}")


def _part_of(param: str) -> str:
    """The part a parameter belongs to: ``layers.N`` or its top-level module's name."""
    head, _, rest = param.partition(".")
    if head == "layers":
        return f"layers.{rest.split('.', 1)[0]}"
    return head


def _parameters_by_part(params: dict[str, nn.Parameter]) -> dict[str, list[str]]:
    parts: dict[str, list[str]] = {}
    for name in params:
        parts.setdefault(_part_of(name), []).append(name)
    return parts
