"""Hugging Face transformers as the oracle: greedy generation token ids for given prompts."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


def load_hf_model(folder: Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_greedy(model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int
              ) -> list[list[int]]:
    """Greedy continuation of each prompt by ``generate``, never stopping at EOS."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        outputs.append(out[0, len(prompt):].tolist())
    return outputs


@torch.no_grad()
def hf_greedy_logprobs(model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int
                       ) -> list[list[tuple[int, float]]]:
    """Greedy continuation with each chosen token's log-probability (from the raw logits)."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
        tokens = out.sequences[0, len(prompt):].tolist()
        steps = [logits[0].float().log_softmax(-1) for logits in out.logits]
        outputs.append([(t, float(step[t])) for t, step in zip(tokens, steps, strict=True)])
    return outputs


def random_prompts(lengths: list[int], seed: int, low: int = 100, high: int = 20000
                   ) -> list[list[int]]:
    """Prompts of random ordinary token ids (no special tokens), reproducible by seed."""
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(n)] for n in lengths]


@torch.no_grad()
def hf_beam_search(model: PreTrainedModel, prompts: list[list[int]], max_new_tokens: int,
                   num_beams: int, num_return: int, length_penalty: float,
                   early_stopping: bool | str, eos_token_ids: list[int]
                   ) -> list[list[tuple[list[int], float]]]:
    """``generate(num_beams=..., do_sample=False)``: per prompt, the returned beams' output
    tokens (cut after the first EOS, as the engine reports them) and ``sequences_scores``."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_new_tokens, do_sample=False,
                             num_beams=num_beams, num_return_sequences=num_return,
                             length_penalty=length_penalty, early_stopping=early_stopping,
                             eos_token_id=eos_token_ids, pad_token_id=eos_token_ids[0],
                             return_dict_in_generate=True, output_scores=True)
        beams = []
        for row, score in zip(out.sequences, out.sequences_scores, strict=True):
            tokens = row[len(prompt):].tolist()
            ends = [i for i, t in enumerate(tokens) if t in eos_token_ids]
            beams.append((tokens[: ends[0] + 1] if ends else tokens, float(score)))
        outputs.append(beams)
    return outputs
