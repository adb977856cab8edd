"""SmolLM2's Q4_1 GGUF kept quantized gives today's dequantised path's greedy tokens.

The repack is lossless (``test_gguf_kept_quantized.py`` checks it bit for bit), so only
the order of the float summations differs between the two paths. Greedy tokens on the
parity prompts are compared; should a near-tie flip a token, the teacher-forced top-1
agreement (same token sequences for both) must still be >= 99.5%.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.engine_run import one_torch_thread
from helpers.hf_reference import random_prompts

from kvrelay_worker.engine.llm import LLM
from kvrelay_worker.engine.sampling_params import SamplingParams
from kvrelay_worker.models.quantize_model import weight_bytes
from kvrelay_worker.teacher_forcing import sequence_logits

PROMPT_LENGTHS = [5, 40, 120]  # a subset of test_hf_parity's lengths: each costs seconds
NEW_TOKENS = 16


@pytest.mark.slow
def test_kept_quantized_smollm2_matches_the_dequantised_path(
        smollm2_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference matmul (dequantize + F.linear): what is tested is the repacked model,
    # and compiling the CPU loops for five SmolLM2 shapes would cost minutes on a cold CI.
    monkeypatch.setenv("KVRELAY_KERNELS", "reference")
    prompts = random_prompts(PROMPT_LENGTHS, seed=len("smollm2"))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    options = {"device": "cpu", "dtype": "float32", "num_kv_blocks": 64,
               "enable_prefix_caching": False}
    with one_torch_thread():
        outputs = {}
        logits = {}
        sizes = {}
        for quantization in ("none", "gguf"):
            llm = LLM("smollm2-135m-instruct", quantization=quantization, **options)
            outputs[quantization] = [o.choices[0].token_ids for o in llm.generate(prompts, params)]
            sequences = [p + o for p, o in zip(prompts, outputs["none"], strict=True)]
            logits[quantization] = [sequence_logits(llm.engine, s)[-NEW_TOKENS - 1:-1]
                                    for s in sequences]
            sizes[quantization] = weight_bytes(llm.engine.model)
            del llm
    agree = torch.cat([(a.argmax(-1) == b.argmax(-1)).float()
                       for a, b in zip(logits["gguf"], logits["none"], strict=True)])
    assert agree.mean().item() >= 0.995, f"teacher-forced top-1 agreement {agree.mean():.4f}"
    if outputs["gguf"] != outputs["none"]:
        pytest.fail(f"greedy tokens differ although teacher-forced agreement is "
                    f"{agree.mean():.4f}: {outputs}")
    assert sizes["gguf"] < 0.25 * sizes["none"]
