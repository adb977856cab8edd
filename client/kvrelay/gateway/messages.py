"""Chat-completions ``messages`` -> the SDK's ``ChatMessage`` list.

OpenAI's roles (``developer`` is a system message for templates, which know no
developer role); the keys an OpenAI response puts on an assistant message that a caller
sends back unchanged (``refusal``, ``audio``, ``function_call``, ``annotations``) are
accepted while they hold nothing. Everything else is checked by
``kvrelay.chat_inputs.messages_from``, as the SDK checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvrelay.chat_inputs import messages_from
from kvrelay.errors import InvalidRequest
from kvrelay.gateway.errors import bad_request
from kvrelay.gateway.params import param_of
from kvrelay.protocol import ChatMessage

ROLES: Final = ("system", "developer", "user", "assistant", "tool")
# Assistant-message keys of OpenAI's responses with no meaning here once empty.
_EMPTY_ONLY: Final = ("refusal", "audio", "function_call", "annotations")


def _plain(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = dict(message)
    role = out.get("role")
    if isinstance(role, str) and role not in ROLES:
        raise bad_request(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}",
                          f"{where}.role")
    if role == "developer":
        out["role"] = "system"
    for key in _EMPTY_ONLY:
        if key in out and out.pop(key) not in (None, [], {}):
            raise bad_request(f"{where}.{key} is not supported (kvrelay's messages carry "
                              "text, tool calls and reasoning)", f"{where}.{key}")
    return out


def chat_messages(raw: list[dict[str, Any]]) -> list[ChatMessage]:
    """The conversation, or a 400 naming the message and field at fault."""
    plain = [_plain(m, f"messages[{i}]") for i, m in enumerate(raw)]
    try:
        return messages_from(plain)
    except InvalidRequest as exc:
        raise bad_request(str(exc), param_of(str(exc), "messages")) from None
