"""Quantize a float Hugging Face folder with GPTQModel (GPTQ, or AWQ in AutoAWQ's GEMM
packing), and dequantize it with GPTQModel.

Run by the tests in llmcompressor's environment (``helpers/compressed_checkpoints.py``)::

    python make_gptqmodel_checkpoint.py SRC DEST_ROOT NAME...

NAME is ``gptq-<bits>bit-g<group>[-desc]`` or ``awq-gemm-g<group>[-sym]`` (``g-1``: one
group per channel; ``-sym``: no zero point, ``zero_point: false``). For each it writes
``DEST_ROOT/NAME`` (GPTQModel's checkpoint, calibrated on a few local sentences; AWQ's is
``quant_method: "awq"``, ``version: "gemm"``) and ``DEST_ROOT/NAME-dequantized``: the same
model as float32 safetensors whose linear weights are GPTQModel's own dequantization of each
layer (GPTQ's ``dequantize_weight``, AWQ's ``dequantize_gemm``: what its torch kernels
multiply by, run on float32 scales as its CPU kernels compute in float16 or bfloat16
only), the oracle transformers then runs as a plain float model. One process makes them
all: GPTQModel's imports alone take ~10 s.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

# GPTQModel sizes its CPU thread pools from the cores and refuses fewer than its loader's 2.
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")

import torch
from calibration_text import CALIBRATION
from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
from safetensors import safe_open
from safetensors.torch import save_file

GPTQ_NAME = re.compile(r"gptq-(\d)bit-g(\d+)(-desc)?$")
AWQ_NAME = re.compile(r"awq-gemm-g(-1|\d+)(-sym)?$")
PACKED = (".qweight", ".qzeros", ".scales", ".g_idx")


def quantize_gptq(src: str, dest: Path, bits: int, group: int, desc_act: bool) -> None:
    config = QuantizeConfig(bits=bits, group_size=group, desc_act=desc_act, sym=True,
                            offload_to_disk=False)
    model = GPTQModel.load(src, config, device="cpu")
    model.quantize(CALIBRATION, batch_size=1)
    model.save(str(dest))


def quantize_awq(src: str, dest: Path, group: int, sym: bool) -> None:
    config = QuantizeConfig(quant_method="awq", format="gemm", bits=4, group_size=group,
                            sym=sym, offload_to_disk=False)
    model = GPTQModel.load(src, config, device="cpu")
    # GPTQModel packs AWQ's GEMM format with its CUDA kernel's module unless told to use
    # the torch one, which writes the same tensors on CPU (``pack_awq``)
    model.quantize(CALIBRATION, batch_size=1, backend=BACKEND.AWQ_TORCH)
    model.save(str(dest))


def dequantized_weights(quantized: Path, awq: bool) -> dict[str, torch.Tensor]:
    """Each quantized linear layer's weight [out, in] in float32, as GPTQModel computes it."""
    backend = BACKEND.AWQ_TORCH if awq else BACKEND.TORCH
    model = GPTQModel.load(str(quantized), device="cpu", backend=backend, dtype=torch.float16)
    weights: dict[str, torch.Tensor] = {}
    for name, module in model.model.named_modules():
        if awq and hasattr(module, "qzeros") and type(module).__name__.startswith("Awq"):
            weight = dequantize_gemm(qweight=module.qweight, qzeros=module.qzeros,
                                     scales=module.scales.float(), bits=module.bits,
                                     group_size=module.group_size)  # [K, N]
            weights[f"{name}.weight"] = weight.T.float().contiguous()
        elif not awq and hasattr(module, "dequantize_weight") and hasattr(module, "g_idx"):
            module.scales = module.scales.float()
            weights[f"{name}.weight"] = module.dequantize_weight().T.float().contiguous()
    if not weights:
        raise SystemExit(f"GPTQModel loaded no quantized layer from {quantized}")
    return weights


def dequantized_copy(src: str, quantized: Path, dest: Path, awq: bool) -> None:
    """``dest``: ``quantized`` as float32 weights, dequantized by GPTQModel itself."""
    weights = dequantized_weights(quantized, awq)
    with safe_open(str(quantized / "model.safetensors"), "pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
            if not key.endswith(PACKED):
                weights[key] = handle.get_tensor(key).float()
    dest.mkdir(parents=True)
    save_file(weights, str(dest / "model.safetensors"))
    for file in Path(src).iterdir():
        if file.name != "model.safetensors" and file.is_file():
            shutil.copy(file, dest / file.name)


def make(src: str, root: Path, name: str) -> None:
    torch.manual_seed(0)
    if (gptq := GPTQ_NAME.match(name)) is not None:
        quantize_gptq(src, root / name, int(gptq.group(1)), int(gptq.group(2)),
                      bool(gptq.group(3)))
    elif (awq := AWQ_NAME.match(name)) is not None:
        quantize_awq(src, root / name, int(awq.group(1)), bool(awq.group(2)))
    else:
        raise SystemExit(f"not a GPTQ or AWQ checkpoint name: {name}")
    dequantized_copy(src, root / name, root / f"{name}-dequantized", awq=gptq is None)


def main() -> None:
    src, root, *names = sys.argv[1:]
    for name in names:
        make(src, Path(root), name)


if __name__ == "__main__":
    main()
