"""Tokenizers that carry a model family's chat template and call tokens, without the hub.

The families' own tokenizers cannot be downloaded here, so each is SmolLM2's tokenizer
with the family's template (``tests/fixtures/chat_templates``, as the vendors publish
them) and the family's marker tokens added as that family declares them: Qwen's
``<tool_call>`` and ``<think>`` as ordinary added tokens, Llama 3's and Mistral's markers
as special tokens (so a decode that skips special tokens drops them, as the real ones do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AddedToken, AutoTokenizer

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Family:
    template: str  # file name under fixtures/chat_templates
    plain_tokens: tuple[str, ...] = ()
    special_tokens: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family("qwen2_5_instruct.jinja",
                      plain_tokens=("<tool_call>", "</tool_call>")),
    "qwen3": Family("qwen3.jinja",
                    plain_tokens=("<tool_call>", "</tool_call>", "<think>", "</think>")),
    "llama3": Family("llama3_2_instruct.jinja",
                     special_tokens=("<|begin_of_text|>", "<|start_header_id|>",
                                     "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                                     "<|python_tag|>"),
                     bos="<|begin_of_text|>", eos="<|eot_id|>"),
    "mistral": Family("mistral_instruct_v0_3.jinja",
                      special_tokens=("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                                      "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                                      "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]",
                                      "[CALL_ID]"),
                      bos="<s>", eos="</s>"),
}


def chat_template(family: str) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text()


def family_tokenizer(tokenizer_folder: Path, family: str) -> Any:
    """SmolLM2's tokenizer dressed as ``family``'s (see the module's docstring)."""
    spec = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    if spec.plain_tokens:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                              for t in spec.plain_tokens])
    if spec.special_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(spec.special_tokens)})
    if spec.bos is not None:
        tokenizer.bos_token = spec.bos
    if spec.eos is not None:
        tokenizer.eos_token = spec.eos
    tokenizer.chat_template = chat_template(family)
    return tokenizer


def assistant_turn(tokenizer: Any, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, reply: dict[str, Any]) -> str:
    """What the template shows the model writing as ``reply``: the rendered conversation
    with the reply, less the conversation's generation prompt, up to the end-of-turn
    token (a model stops there)."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                           add_generation_prompt=True)
    whole = tokenizer.apply_chat_template([*messages, reply], tools=tools, tokenize=False)
    assert whole.startswith(prompt), (prompt, whole)
    written: str = whole[len(prompt):]
    end = written.find(tokenizer.eos_token)
    return written if end < 0 else written[:end + len(tokenizer.eos_token)]
