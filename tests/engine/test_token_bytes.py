"""Token bytes: joining the bytes of a text's tokens gives the text's UTF-8 exactly, for a
byte-level BPE tokenizer (SmolLM2's) and a SentencePiece one with byte fallback (built
here with the ``tokenizers`` library, as Llama 2's tokenizer.json describes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.sample.token_bytes import TokenBytes, token_bytes_for
from kvrelay_worker.loading.tokenizer import load_tokenizer

TEXT = "Le café coûte 3 € — naïve façade, 東京 and 🙂 emoji.\nNew line\ttab."


@pytest.fixture(scope="module")
def smollm2_tokenizer(tokenizer_folder: Path) -> Any:
    return load_tokenizer(tokenizer_folder)


def test_byte_level_pieces_join_to_the_utf8_of_the_text(smollm2_tokenizer: Any) -> None:
    table = token_bytes_for(smollm2_tokenizer)
    assert table.scheme == "byte_level"
    ids = smollm2_tokenizer.encode(TEXT)
    pieces = [table(i) for i in ids]
    assert b"".join(pieces) == TEXT.encode()
    # Some tokens hold part of a character: decoding them one by one could not do this.
    assert any(_not_utf8(p) for p in pieces)
    assert table(ids[0]) is table(ids[0])  # computed once, then kept
    assert token_bytes_for(smollm2_tokenizer) is table  # one table per tokenizer


def test_special_tokens_are_their_text(smollm2_tokenizer: Any) -> None:
    table = token_bytes_for(smollm2_tokenizer)
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert table(smollm2_tokenizer.get_vocab()[name]) == name.encode()


def test_generated_tokens_join_to_the_generated_text(smollm2_folder: Path) -> None:
    """The engine's own output (greedy SmolLM2 answering in French and Japanese)."""
    llm = LLM(str(smollm2_folder), device="cpu", dtype="float32", num_kv_blocks=64)
    prompts = [llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
        for question in ("Écris une phrase en français sur le café.",
                         "日本語で「こんにちは」と書いてください。")]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0,
                                                   logprobs=2))
    table = token_bytes_for(llm.tokenizer)
    special = set(llm.tokenizer.all_special_ids)
    non_ascii = 0
    for out in outputs:
        kept = [t for t in out.token_ids if t not in special]
        joined = b"".join(table(t) for t in kept)
        assert joined.decode("utf-8", "replace") == out.text
        non_ascii += any(b >= 0x80 for b in joined)
        assert out.logprobs is not None
        for lp in out.logprobs:  # alternatives have bytes too
            assert all(table(t) for t, _ in lp.top)
    assert non_ascii, "no generated text left ASCII: the test proves little"


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style tokenizer: ``▁`` for spaces, ``<0xNN>`` byte fallback tokens."""
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    letters = ["\u2581", "L", "e", "c", "a", "f", "é", "t", "h"]
    merges = [("\u2581", "L"), ("\u2581L", "e"), ("\u2581", "c"), ("\u2581c", "a"),
              ("\u2581ca", "f"), ("\u2581", "t"), ("\u2581t", "h"), ("\u2581th", "e")]
    pieces = specials + letters + [left + right for left, right in merges]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                       prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


def test_sentencepiece_spaces_and_byte_fallback() -> None:
    tokenizer = sentencepiece_tokenizer()
    table = TokenBytes(tokenizer)
    vocab = tokenizer.get_vocab()
    assert table.scheme == "sentencepiece"
    text = "Le café the 東"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [table(i) for i in ids]
    # The decoder strips the leading space the pre-tokenizer added; the bytes keep it.
    assert b"".join(pieces) == b" " + text.encode()
    assert table(vocab["<0xE6>"]) == b"\xe6"  # a byte token
    assert table(vocab["\u2581caf"]) == b" caf"
    assert any(_not_utf8(p) for p in pieces)  # 東 came as byte tokens
    assert table(vocab["</s>"]) == b"</s>"


def _not_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
