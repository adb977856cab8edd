"""One check that two tokenizers are the same: class, backend, special tokens and ids,
chat template, BOS/EOS flags, token ids and decoded text."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

TEXTS = [
    "Hello world",
    "the theme of the thesis",
    "  leading and trailing spaces  ",
    "héllo ✓ 日本語 🙂 — ça va?",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|endoftext|>",
    "tabs\tand\nnewlines\r\n\n",
    "",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Ünïcode? ✓"},
]


def assert_same_tokenizer(ours: PreTrainedTokenizerBase, ref: PreTrainedTokenizerBase) -> None:
    assert type(ours) is type(ref)
    assert ours.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert len(ours) == len(ref)
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.added_tokens_decoder == ref.added_tokens_decoder
    assert ours.special_tokens_map == ref.special_tokens_map
    assert ours.all_special_ids == ref.all_special_ids
    for attribute in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                      "add_bos_token", "add_eos_token", "chat_template"):
        assert getattr(ours, attribute) == getattr(ref, attribute), attribute
    assert ours.chat_template
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), text
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                    ids, skip_special_tokens=skip), text
        assert ours.tokenize(text) == ref.tokenize(text), text
    assert ours(TEXTS[:3]).input_ids == ref(TEXTS[:3]).input_ids
    for generation_prompt in (False, True):
        assert ours.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=generation_prompt
        ) == ref.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=generation_prompt)
