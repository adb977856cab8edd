"""Narrowing the ``openai`` package's output-item unions to the kinds kvrelay returns
(an assertion each, so a wrong kind fails the test where it is read)."""

from __future__ import annotations

from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)


def message_item(item: object) -> ResponseOutputMessage:
    assert isinstance(item, ResponseOutputMessage), item
    return item


def call_item(item: object) -> ResponseFunctionToolCall:
    assert isinstance(item, ResponseFunctionToolCall), item
    return item


def reasoning_item(item: object) -> ResponseReasoningItem:
    assert isinstance(item, ResponseReasoningItem), item
    return item


def text_part(item: object) -> ResponseOutputText:
    """The one ``output_text`` part of a message item."""
    [part] = message_item(item).content
    assert isinstance(part, ResponseOutputText), part
    return part
