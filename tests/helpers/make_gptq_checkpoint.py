"""Quantize a float Hugging Face folder with GPTQModel, and dequantize it with GPTQModel.

Run by ``helpers.compressed_checkpoints`` in the quantization tools' environment
(``.venv/quant-tools``), never imported by the tests::

    python make_gptq_checkpoint.py SRC DEST_ROOT NAME...

NAME is ``gptq-<bits>bit-g<group>[-desc]``. For each it writes ``DEST_ROOT/NAME`` (GPTQModel's
checkpoint, calibrated on a few local sentences) and ``DEST_ROOT/NAME-dequantized``: the
same model as float32 safetensors whose linear weights are GPTQModel's own
``dequantize_weight`` of each layer (computed in float32: its CPU kernel runs float16 or
bfloat16 only), the oracle transformers then runs as a plain float model.
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
from safetensors import safe_open
from safetensors.torch import save_file

NAME = re.compile(r"gptq-(\d)bit-g(\d+)(-desc)?$")


def quantize(src: str, dest: Path, bits: int, group: int, desc_act: bool) -> None:
    torch.manual_seed(0)
    config = QuantizeConfig(bits=bits, group_size=group, desc_act=desc_act, sym=True,
                            offload_to_disk=False)
    model = GPTQModel.load(src, config, device="cpu")
    model.quantize(CALIBRATION, batch_size=1)
    model.save(str(dest))


def dequantized_copy(src: str, quantized: Path, dest: Path) -> None:
    """``dest``: ``quantized`` as float32 weights, dequantized by GPTQModel itself."""
    model = GPTQModel.load(str(quantized), device="cpu", backend=BACKEND.TORCH,
                           dtype=torch.float16)
    weights: dict[str, torch.Tensor] = {}
    for name, module in model.model.named_modules():
        if hasattr(module, "dequantize_weight") and hasattr(module, "g_idx"):
            module.scales = module.scales.float()
            weights[f"{name}.weight"] = module.dequantize_weight().T.float().contiguous()
    with safe_open(str(quantized / "model.safetensors"), "pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
            if not key.endswith((".qweight", ".qzeros", ".scales", ".g_idx")):
                weights[key] = handle.get_tensor(key).float()
    dest.mkdir(parents=True)
    save_file(weights, str(dest / "model.safetensors"))
    for file in Path(src).iterdir():
        if file.name != "model.safetensors" and file.is_file():
            shutil.copy(file, dest / file.name)


def main() -> None:
    src, root, *names = sys.argv[1:]
    for name in names:
        match = NAME.match(name)
        if match is None:
            raise SystemExit(f"not a GPTQ checkpoint name: {name}")
        bits, group, desc = int(match.group(1)), int(match.group(2)), bool(match.group(3))
        quantize(src, Path(root) / name, bits, group, desc)
        dequantized_copy(src, Path(root) / name, Path(root) / f"{name}-dequantized")


if __name__ == "__main__":
    main()
