"""Chat messages to prompt token ids through the model's own chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvrelay_worker.engine.errors import InvalidPromptError

_ROLES = ("system", "user", "assistant", "tool")


def validate_messages(messages: object) -> list[dict[str, str]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidPromptError("messages must be a non-empty list of {role, content} mappings")
    clean = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidPromptError(f"message {i} must be a mapping with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in _ROLES:
            raise InvalidPromptError(f"message {i} has role {role!r}; expected one of {_ROLES}")
        if not isinstance(content, str):
            raise InvalidPromptError(f"message {i} content must be a string")
        clean.append({"role": str(role), "content": content})
    return clean


def apply_chat_template(tokenizer: Any, messages: object,
                        add_generation_prompt: bool = True) -> list[int]:
    """Render ``messages`` with the tokenizer's template and return the prompt token ids."""
    clean = validate_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidPromptError("this model has no chat template; send a plain prompt instead")
    text = tokenizer.apply_chat_template(clean, add_generation_prompt=add_generation_prompt,
                                         tokenize=False)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids
