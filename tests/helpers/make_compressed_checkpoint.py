"""Quantize a float Hugging Face folder with llmcompressor, data-free, into compressed-tensors.

Run by ``helpers.compressed_checkpoints`` in the quantization tools' environment
(``.venv/quant-tools``: llmcompressor pins an older transformers than the project's, so it
gets its own, made by ``make install``), never imported by the tests themselves::

    python make_compressed_checkpoint.py SRC DEST_ROOT SCHEME...

writes ``DEST_ROOT/SCHEME`` for each SCHEME, a recipe below (one process: importing
llmcompressor and transformers takes longer than quantizing SmolLM2). SmolLM2's 576-wide rows are not a multiple of llmcompressor's
default group of 128 and its observers refuse partial groups (even with
``bypass_divisibility_checks``), so ``W4A16`` quantizes, as llmcompressor's own error
message advises, only the layers whose inputs divide 128 (``down_proj``, 1536 inputs) and
leaves the others float; the ``-g64`` and channel variants quantize every linear layer.
The float presets (``PRESETS``) quantize every linear layer but the head; ``FP8``'s static
activation scales, like AWQ, are calibrated on the local sentences of ``calibration_text``.
"""

from __future__ import annotations

import sys

import torch
from calibration_text import CALIBRATION
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from llmcompressor.modifiers.transform.awq import AWQModifier
from llmcompressor.pipelines.cache import IntermediatesCache
from transformers import AutoModelForCausalLM, AutoTokenizer

# The layers whose 576 inputs are not a multiple of 128.
NOT_DIVISIBLE_BY_128 = [r"re:.*(q|k|v|o|gate|up)_proj$"]
# Float presets: FP8 weights per channel with dynamic per-token activations, per tensor
# with a static activation scale (calibrated), 128x128 blocks; NVFP4 and MXFP4 (refused by
# the engine).
PRESETS = ("FP8_DYNAMIC", "FP8", "FP8_BLOCK", "NVFP4A16", "MXFP4A16")


def _scheme(bits: int, strategy: str, group_size: int | None = None,
            symmetric: bool = True, kind: str = "int") -> QuantizationScheme:
    weights = QuantizationArgs(num_bits=bits, type=kind, strategy=strategy,
                               group_size=group_size, symmetric=symmetric, dynamic=False)
    return QuantizationScheme(targets=["Linear"], weights=weights)




def recipe(name: str) -> QuantizationModifier | list[object]:
    if name == "AWQ-W4A16-asym-g64":
        # AWQ scales salient input channels, then quantizes: compressed-tensors again
        return [AWQModifier(n_grid=4), QuantizationModifier(
            config_groups={"group_0": _scheme(4, "group", 64, symmetric=False)},
            ignore=["lm_head"])]
    if name == "W4A16":
        return QuantizationModifier(targets="Linear", scheme="W4A16",
                                    ignore=["lm_head", *NOT_DIVISIBLE_BY_128])
    if name in PRESETS:  # llmcompressor's own presets, every linear layer but the head
        return QuantizationModifier(targets="Linear", scheme=name, ignore=["lm_head"])
    schemes = {
        "W4A16-g64": _scheme(4, "group", 64),
        "W4A16-asym-g64": _scheme(4, "group", 64, symmetric=False),
        "W4A16-channel": _scheme(4, "channel"),
        "W8A16-channel": _scheme(8, "channel"),
        "W8A16-asym-channel": _scheme(8, "channel", symmetric=False),
        "FP8-channel": _scheme(8, "channel", kind="float"),
    }
    return QuantizationModifier(config_groups={"group_0": schemes[name]}, ignore=["lm_head"])


def _no_pinned_memory_without_an_accelerator() -> None:
    """llmcompressor 0.14.0.1's AWQ pins its cached activations unconditionally, which torch
    refuses on a machine without an accelerator; pinning only speeds up host-to-device
    copies, so without one it is skipped."""
    if not torch.cuda.is_available():
        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]


def main() -> None:
    _no_pinned_memory_without_an_accelerator()
    src, root, *names = sys.argv[1:]
    tokenizer = AutoTokenizer.from_pretrained(src)
    for name in names:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        if name.startswith("AWQ") or name == "FP8":  # observers of activations: calibrate
            calibration = Dataset.from_dict({"text": CALIBRATION})
            oneshot(model=model, recipe=recipe(name), dataset=calibration,
                    max_seq_length=64, num_calibration_samples=len(CALIBRATION))
        else:
            oneshot(model=model, recipe=recipe(name))
        model.save_pretrained(f"{root}/{name}", save_compressed=True)
        tokenizer.save_pretrained(f"{root}/{name}")


if __name__ == "__main__":
    main()
