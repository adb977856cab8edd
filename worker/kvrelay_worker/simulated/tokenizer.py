"""A tokenizer for the simulated engine: deterministic, instant, and no files to load.

Text becomes one token per 4 UTF-8 bytes (about what a real BPE vocabulary gives for
English), so prompt lengths and their costs resemble a real model's. A token's text is
`` t<id>``; nothing here is meant to be read, only counted and matched (stop strings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

VOCAB_SIZE = 32_000
_BYTES_PER_TOKEN = 4


class SimulatedTokenizer:
    chat_template = "role: content lines, then 'assistant:'"
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        data = text.encode("utf-8", errors="surrogatepass")
        return [int.from_bytes(data[i:i + _BYTES_PER_TOKEN], "little") % VOCAB_SIZE
                for i in range(0, len(data), _BYTES_PER_TOKEN)]

    @staticmethod
    def token_text(token_id: int) -> str:
        return f" t{token_id}"

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.token_text(t) for t in token_ids)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, tokenize: bool = False,
                            **template_variables: Any) -> str:
        """Each message as a line; tools and other template variables change nothing."""
        text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")
