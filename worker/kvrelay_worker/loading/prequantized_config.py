"""A published quantized checkpoint's ``quantization_config``: what we keep, what we refuse.

Hugging Face folders written by ``llmcompressor`` carry ``quant_method:
"compressed-tensors"`` and one or more ``config_groups``, each a scheme for the layers it
targets. The engine keeps, quantized as stored, the weight-only integer schemes that map
exactly onto ``kvrelay_kernels.quantized_weight``'s layout (``prequantized_model`` repacks
them at load):

- int4 and int8, symmetric or asymmetric (zero points), per group or per output channel
  (asymmetric int8 on the layout's int8 with minimums);

in the ``pack-quantized`` format (values packed into int32) or ``naive-quantized`` (one
int8 per value). GPTQ checkpoints (``quant_method: "gptq"``, GPTQModel and AutoGPTQ) of 4
or 8 bits, symmetric, are kept the same way, activation order (``desc_act``, a ``g_idx``
per layer) included: their input columns are permuted once at load. AutoAWQ checkpoints
(``quant_method: "awq"``, AutoAWQ, GPTQModel and most ``-AWQ`` repositories on the hub) in
the GEMM packing (``version``/``format`` ``"gemm"``) of 4 bits are kept too, with their
zero points (``zero_point: true``) or without (GPTQModel's symmetric AWQ stores zero points
of 8), per group of any size or per channel (``group_size: -1``); the layers named in
``modules_to_not_convert`` are float in the checkpoint and stay float.

FP8 weights (``type: float, num_bits: 8``: float8_e4m3fn in the ``float-quantized`` format,
or ``naive-quantized`` for weight-only FP8) are kept too, as stored (``Fp8Scheme``, ``kvrelay_kernels.fp8_weight``): llmcompressor's
``FP8_DYNAMIC`` (a scale per output channel, activations quantized per token at run
time), ``FP8`` (a scale per tensor, a static activation scale) and ``FP8_BLOCK`` (a scale
per 128x128 block, activations per group of 128), or weight-only. Their activation scheme
is honoured by the GPU's FP8 matmuls (compute capability 8.9+); the CPU and the other
GPUs multiply float activations by the FP8 weight (weight-only, more accurate).

Everything else is refused with ``UnsupportedModelError`` saying so: other float weights
(NVFP4, MXFP4), quantized activations with integer weights (W8A8, W4A8), integer block or
tensor-group strategies, sparsity, transforms, a quantized KV cache, AWQ's other packings
(GEMV, GEMV-fast, Marlin, llm-awq) and bit widths, and other methods (bitsandbytes, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvrelay_worker.models.errors import UnsupportedModelError

COMPRESSED_TENSORS = "compressed-tensors"
GPTQ = "gptq"
# GPTQ's packed layouts: v1 stores each zero point minus one, v2 as it is.
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ = "awq"
# ``WeightScheme.format`` of AutoAWQ's GEMM packing (``version: "gemm"``).
AWQ_GEMM = "awq-gemm"
# ``ModelConfig.extra`` key of a pre-quantized checkpoint's ``WeightScheme``.
PREQUANTIZED_KEY = "prequantized"
SUPPORTED_FORMATS = ("pack-quantized", "naive-quantized")
# compressed-tensors' format of FP8 weights (one float8_e4m3fn per value); a weight-only
# FP8 scheme is saved as naive-quantized, with the same float8_e4m3fn tensor.
FLOAT_FORMAT = "float-quantized"
FP8_FORMATS = (FLOAT_FORMAT, "naive-quantized")
FP8_STRATEGIES = ("channel", "tensor", "block")
SUPPORTED = ("compressed-tensors (llmcompressor) weight-only int4 and int8 (symmetric or "
             "asymmetric), per group or per channel, pack-quantized or naive-quantized; "
             "compressed-tensors FP8 (float-quantized e4m3) weights per channel, per tensor "
             "or in blocks, with dynamic, static or no activation quantization; "
             "GPTQ (GPTQModel, AutoGPTQ) 4- and 8-bit symmetric, with or without desc_act "
             "(4-bit asymmetric in the gptq_v2 format); "
             "AWQ (AutoAWQ, GPTQModel) 4-bit in the GEMM packing, with or without zero_point, "
             "per group or per channel")


@dataclass(frozen=True)
class WeightScheme:
    """One weight-only integer scheme of a compressed-tensors checkpoint."""

    bits: int
    symmetric: bool
    group_size: int | None  # None: one scale per output channel
    format: str

    def describe(self) -> str:
        kind = "symmetric" if self.symmetric else "asymmetric"
        groups = "per channel" if self.group_size is None else f"groups of {self.group_size}"
        return f"int{self.bits} {kind}, {groups} ({self.format})"


@dataclass(frozen=True)
class Fp8Scheme:
    """One FP8-weight scheme of a compressed-tensors checkpoint (``float-quantized``)."""

    strategy: str  # "channel", "tensor" or "block"
    block: tuple[int, int] | None  # a block's [output rows, inputs] (block strategy)
    activations: str  # "dynamic" (per token, or per group with blocks), "static", "none"
    format: str = FLOAT_FORMAT

    def describe(self) -> str:
        weights = (f"{self.block[0]}x{self.block[1]} blocks" if self.block is not None
                   else f"per {self.strategy}")
        acts = {"dynamic": "dynamic activations", "static": "static activation scale",
                "none": "weight-only"}[self.activations]
        return f"fp8 e4m3 {weights}, {acts} ({self.format})"


# What ``checkpoint_scheme`` returns: the scheme that decides how layers are repacked.
PrequantizedScheme = WeightScheme | Fp8Scheme


def _refuse(source: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{source}: {why}; supported pre-quantized checkpoints: "
                                 f"{SUPPORTED}")


def checkpoint_scheme(quantization: Mapping[str, Any], source: str) -> PrequantizedScheme:
    """The one weight scheme ``quantization`` (a ``quantization_config``) applies, or raise."""
    method = quantization.get("quant_method", "?")
    if method == GPTQ:
        return _gptq_scheme(quantization, source)
    if method == AWQ:
        return _awq_scheme(quantization, source)
    if method != COMPRESSED_TENSORS:
        raise _refuse(source, f"pre-quantized checkpoints of method {method!r} are not "
                              "supported (use float16/bfloat16/float32 safetensors or a GGUF "
                              "file)")
    for key in ("sparsity_config", "transform_config"):
        if quantization.get(key):
            raise _refuse(source, f"compressed-tensors {key.removesuffix('_config')} is not "
                                  "supported")
    if quantization.get("kv_cache_scheme"):
        raise _refuse(source, "a quantized KV cache scheme is not supported")
    status = quantization.get("quantization_status", "compressed")
    if status != "compressed":
        raise _refuse(source, f"quantization_status {status!r} (only saved-compressed "
                              "checkpoints are read)")
    groups = quantization.get("config_groups") or {}
    if not groups:
        raise _refuse(source, "compressed-tensors config without config_groups")
    schemes = {_group_scheme(name, group, quantization.get("format"), source)
               for name, group in groups.items()}
    if len(schemes) != 1:
        raise _refuse(source, "several weight schemes in one checkpoint "
                              f"({'; '.join(sorted(s.describe() for s in schemes))})")
    return schemes.pop()


def _group_scheme(name: str, group: Mapping[str, Any], default_format: Any,
                  source: str) -> PrequantizedScheme:
    where = f"config group {name!r}"
    fmt = str(group.get("format") or default_format or "?")
    weights = group.get("weights") or {}
    if weights.get("type", "int") == "float":
        return _fp8_scheme(where, group, fmt, source)
    if group.get("input_activations") or group.get("output_activations"):
        raise _refuse(source, f"{where} quantizes activations (only weight-only schemes such "
                              "as W4A16/W8A16 are kept)")
    if not weights:
        raise _refuse(source, f"{where} has no weight scheme")
    kind = weights.get("type", "int")
    bits = int(weights.get("num_bits") or 0)
    if kind != "int":
        raise _refuse(source, f"{where} has {kind} weights")
    if fmt not in SUPPORTED_FORMATS:
        raise _refuse(source, f"{where} is in format {fmt!r}")
    symmetric = bool(weights.get("symmetric", True))
    if bits not in (4, 8):
        raise _refuse(source, f"{where} has {bits}-bit weights")
    strategy = weights.get("strategy")
    if weights.get("actorder") not in (None, "static", "weight"):
        raise _refuse(source, f"{where} has activation-ordered groups "
                              f"(actorder={weights.get('actorder')!r})")
    if weights.get("dynamic"):
        raise _refuse(source, f"{where} has dynamic weight quantization")
    if strategy == "channel":
        return WeightScheme(bits, symmetric, None, fmt)
    if strategy == "group":
        size = int(weights.get("group_size") or 0)
        if size < 1:
            raise _refuse(source, f"{where} has group strategy without a group_size")
        return WeightScheme(bits, symmetric, size, fmt)
    raise _refuse(source, f"{where} has the {strategy!r} strategy")


def _fp8_scheme(where: str, group: Mapping[str, Any], fmt: str, source: str) -> Fp8Scheme:
    """FP8 weights (``float-quantized``), with their activation scheme if any."""
    weights = group["weights"]
    bits = int(weights.get("num_bits") or 0)
    if bits != 8 or fmt not in FP8_FORMATS:
        raise _refuse(source, f"{where} has {bits}-bit float weights in format {fmt!r} "
                              "(only 8-bit float-quantized FP8 has a kernel here; NVFP4 and "
                              "MXFP4 do not)")
    strategy = weights.get("strategy")
    if strategy not in FP8_STRATEGIES:
        raise _refuse(source, f"{where} has FP8 weights with the {strategy!r} strategy")
    if not weights.get("symmetric", True) or weights.get("dynamic"):
        raise _refuse(source, f"{where} has asymmetric or dynamic FP8 weights")
    block = None
    if strategy == "block":
        shape = weights.get("block_structure") or []
        if len(shape) != 2 or min(int(v) for v in shape) < 1:
            raise _refuse(source, f"{where} has block strategy with block_structure {shape!r}")
        block = (int(shape[0]), int(shape[1]))
    if group.get("output_activations"):
        raise _refuse(source, f"{where} quantizes output activations")
    activations = _fp8_activations(where, group.get("input_activations"), block is not None,
                                   source)
    return Fp8Scheme(strategy, block, activations, fmt)


def _fp8_activations(where: str, acts: Mapping[str, Any] | None, blocks: bool,
                     source: str) -> str:
    """``dynamic`` (per token; per group with blocks), ``static`` (per tensor) or ``none``."""
    if not acts:
        return "none"
    if acts.get("type") != "float" or int(acts.get("num_bits") or 0) != 8:
        raise _refuse(source, f"{where} quantizes activations to "
                              f"{acts.get('num_bits')}-bit {acts.get('type')} (FP8 weights "
                              "are kept with FP8 or float activations)")
    strategy = acts.get("strategy")
    if acts.get("dynamic") and (strategy == "token" or (blocks and strategy == "group")):
        return "dynamic"
    if not acts.get("dynamic") and strategy == "tensor":
        return "static"
    raise _refuse(source, f"{where} has {strategy!r} activation quantization "
                          f"(dynamic={acts.get('dynamic')!r})")


def _gptq_scheme(quantization: Mapping[str, Any], source: str) -> WeightScheme:
    """GPTQModel's/AutoGPTQ's ``quantization_config`` (``quantize_config.json`` alike)."""
    fmt = str(quantization.get("checkpoint_format") or quantization.get("format") or "gptq")
    bits = int(quantization.get("bits") or 0)
    symmetric = bool(quantization.get("sym", True))
    if fmt not in GPTQ_FORMATS:
        raise _refuse(source, f"GPTQ checkpoint format {fmt!r}")
    if bits not in (4, 8):
        raise _refuse(source, f"{bits}-bit GPTQ weights")
    if not symmetric and (bits == 8 or fmt == "gptq"):
        raise _refuse(source, f"asymmetric {bits}-bit GPTQ in format {fmt!r} (int8 has no zero "
                              "point here; v1 zero points wrap at 0)")
    if quantization.get("lm_head"):
        raise _refuse(source, "a GPTQ-quantized lm_head")
    size = int(quantization.get("group_size") or -1)
    return WeightScheme(bits, symmetric, None if size <= 0 else size, fmt)


def _awq_scheme(quantization: Mapping[str, Any], source: str) -> WeightScheme:
    """AutoAWQ's ``quantization_config`` (``version``; GPTQModel also writes ``format``;
    AutoAWQ's older ``quant_config.json`` names ``w_bit`` and ``q_group_size``)."""
    version = str(quantization.get("version") or quantization.get("format") or "?").lower()
    if quantization.get("backend") == "llm-awq":
        version = "llm-awq"
    if version != "gemm":
        raise _refuse(source, f"quant_method 'awq' with version {version!r} (only AutoAWQ's "
                              "'gemm' packing is read)")
    bits = int(quantization.get("bits") or quantization.get("w_bit") or 0)
    if bits != 4:
        raise _refuse(source, f"{bits}-bit AWQ weights (awq 'gemm' is read in 4 bits)")
    size = int(quantization.get("group_size") or quantization.get("q_group_size") or -1)
    symmetric = not bool(quantization.get("zero_point", True))
    return WeightScheme(bits, symmetric, None if size <= 0 else size, AWQ_GEMM)
