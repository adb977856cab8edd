"""Quantize a float Hugging Face folder to AutoAWQ's GEMM format with GPTQModel, and
dequantize it with GPTQModel.

Run by ``helpers.compressed_checkpoints`` in the quantization tools' environment
(``.venv/quant-tools``), never imported by the tests::

    python make_awq_checkpoint.py SRC DEST_ROOT NAME...

NAME is ``awq-gemm-g<group>[-sym]`` (``g-1``: one group per channel; ``-sym``: no zero
point, ``zero_point: false``). For each it writes ``DEST_ROOT/NAME`` (GPTQModel's AWQ
checkpoint: ``quant_method: "awq"``, ``version: "gemm"``, scales searched on a few local
sentences) and ``DEST_ROOT/NAME-dequantized``: the same model as float32 safetensors whose
linear weights are GPTQModel's own AWQ dequantization of each layer (``dequantize_gemm``,
what its torch kernel multiplies by, run on float32 scales: its kernels compute in float16
or bfloat16 only), the oracle transformers then runs as a plain float model.
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

NAME = re.compile(r"awq-gemm-g(-1|\d+)(-sym)?$")


def quantize(src: str, dest: Path, group: int, sym: bool) -> None:
    torch.manual_seed(0)
    config = QuantizeConfig(quant_method="awq", format="gemm", bits=4, group_size=group,
                            sym=sym, offload_to_disk=False)
    model = GPTQModel.load(src, config, device="cpu")
    # GPTQModel packs AWQ's GEMM format with its CUDA kernel's module unless told to use
    # the torch one, which writes the same tensors on CPU (``pack_awq``)
    model.quantize(CALIBRATION, batch_size=1, backend=BACKEND.AWQ_TORCH)
    model.save(str(dest))


def dequantized_copy(src: str, quantized: Path, dest: Path) -> None:
    """``dest``: ``quantized`` as float32 weights, dequantized by GPTQModel itself."""
    model = GPTQModel.load(str(quantized), device="cpu", backend=BACKEND.AWQ_TORCH,
                           dtype=torch.float16)
    weights: dict[str, torch.Tensor] = {}
    for name, module in model.model.named_modules():
        if hasattr(module, "qzeros") and type(module).__name__.startswith("Awq"):
            weight = dequantize_gemm(qweight=module.qweight, qzeros=module.qzeros,
                                     scales=module.scales.float(), bits=module.bits,
                                     group_size=module.group_size)  # [K, N]
            weights[f"{name}.weight"] = weight.T.float().contiguous()
    if not weights:
        raise SystemExit(f"GPTQModel loaded no AWQ layer from {quantized}")
    with safe_open(str(quantized / "model.safetensors"), "pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
            if not key.endswith((".qweight", ".qzeros", ".scales")):
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
            raise SystemExit(f"not an AWQ checkpoint name: {name}")
        group, sym = int(match.group(1)), bool(match.group(2))
        quantize(src, Path(root) / name, group, sym)
        dequantized_copy(src, Path(root) / name, Path(root) / f"{name}-dequantized")


if __name__ == "__main__":
    main()
