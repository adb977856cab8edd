"""What ``/v1/chat/completions`` and ``/v1/completions`` do with every body field: the one
classification.

Each field is *honoured* (it changes the job or the answer), a *no-op* (accepted, changes
nothing here, and why is written down), or *refused* (a 400 naming it) unless it holds a
value that asks for nothing (``store: false``, ``service_tier: "auto"``). A field that is
none of these is unknown: the body's decoder refuses it with a 400 naming it. The request
structs (``kvrelay.gateway.requests``) declare exactly these fields; docs/http-api.md's
tables are ``markdown_table``'s output, and ``tests/gateway/test_openai_fields.py`` checks
both against the installed ``openai`` package's request types.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from kvrelay.gateway.errors import bad_request

CHAT_ENDPOINT: Final = "/v1/chat/completions"
TEXT_ENDPOINT: Final = "/v1/completions"


class Handling(enum.Enum):
    HONOURED = "honoured"
    NO_OP = "no-op"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    handling: Handling
    why: str
    # A refused field holding one of these asks for nothing: accepted as if absent.
    inert: tuple[Any, ...] = (None,)


def honoured(why: str) -> Rule:
    return Rule(Handling.HONOURED, why)


def no_op(why: str) -> Rule:
    return Rule(Handling.NO_OP, why)


def refused(why: str, *inert: Any) -> Rule:
    return Rule(Handling.REFUSED, why, (None, *inert))


# OpenAI's fields both endpoints share.
_OPENAI: Mapping[str, Rule] = {
    "model": honoured("the model workers serve"),
    "stream": honoured("Server-Sent Events ending in `data: [DONE]`"),
    "stream_options": honoured("`include_usage`: a last chunk with the usage; "
                               "`include_obfuscation` is a no-op (no padding is added)"),
    "temperature": honoured("0 is greedy"),
    "top_p": honoured("nucleus sampling"),
    "n": honoured("choices sampled from one prompt"),
    "stop": honoured("a string or a list of strings, never shown in the output"),
    "seed": honoured("per-request seed"),
    "presence_penalty": honoured("-2 to 2"),
    "frequency_penalty": honoured("-2 to 2"),
    "logit_bias": honoured("token id -> bias"),
    "user": no_op("an end-user tag for OpenAI's abuse detection"),
    "response_format": honoured("`text`, `json_object`, `json_schema`, and kvrelay's "
                                "`regex` and `choice`; other types are refused"),
}

# vLLM's extras and kvrelay's, on both endpoints.
_EXTRAS: Mapping[str, Rule] = {
    "top_k": honoured("vLLM: 0 or -1 disables"),
    "min_p": honoured("vLLM: minimum probability relative to the most likely token"),
    "repetition_penalty": honoured("vLLM: > 0, 1 disables"),
    "min_tokens": honoured("vLLM: tokens before any stop condition may end a choice"),
    "ignore_eos": honoured("vLLM: keep going past the end-of-sequence token"),
    "priority": honoured("vLLM: higher runs first (capped by the tenant's policy)"),
    "stop_token_ids": honoured("vLLM: extra token ids that end a choice"),
    "guided_json": honoured("vLLM: as `response_format` `json_schema`"),
    "guided_regex": honoured("vLLM: as `response_format` `regex`"),
    "guided_choice": honoured("vLLM: as `response_format` `choice`"),
    "return_tokens_as_token_ids": honoured("vLLM: logprob tokens read `token_id:<id>`"),
    "resumable": honoured("kvrelay: the job outlives a dropped connection, to be resumed "
                          "with `Last-Event-ID`"),
    "speculative": honoured("kvrelay: `false` decodes without speculation"),
}

CHAT: Mapping[str, Rule] = {
    **_OPENAI,
    "messages": honoured("system, developer (as system), user, assistant (`content` may "
                         "be null; `tool_calls`, `reasoning_content`) and tool "
                         "(`tool_call_id`) messages; `name`; text content parts"),
    "max_completion_tokens": honoured("most tokens per choice (wins over `max_tokens`; "
                                      "both with different values are refused)"),
    "max_tokens": honoured("most tokens per choice"),
    "logprobs": honoured("`true`: each token's log-probability"),
    "top_logprobs": honoured("alternatives per token, 0 to 20 (needs `logprobs`)"),
    "tools": honoured("function tools, rendered by the model's chat template; other "
                      "tool types are refused"),
    "tool_choice": honoured('`"auto"`, `"none"`, `"required"` or a named function '
                            "(the last two decode under a grammar of the tools' "
                            "schemas); `allowed_tools` and custom tools are refused"),
    "parallel_tool_calls": honoured("`false`: at most one call per answer"),
    "reasoning_effort": honoured("passed to the chat template (`none` to `high`)"),
    "metadata": no_op("stored nowhere: nothing is stored"),
    "store": refused("kvrelay stores no completions", False),
    "safety_identifier": no_op("an end-user tag for OpenAI's abuse detection"),
    "prompt_cache_key": no_op("the prefix cache needs no key: it matches prefixes of the "
                              "same tenant by content"),
    "prompt_cache_retention": no_op("prefix-cache entries live while KV blocks allow"),
    "prompt_cache_options": refused("the prefix cache has no breakpoints or prewarming",
                                    {}),
    "service_tier": refused("kvrelay has one service tier", "auto", "default"),
    "modalities": refused("text output only", ["text"]),
    "audio": refused("text output only"),
    "prediction": refused("predicted outputs are not supported"),
    "verbosity": refused("the model's verbosity is not adjustable", "medium"),
    "web_search_options": refused("kvrelay has no web search"),
    "moderation": refused("kvrelay runs no moderation model"),
    "functions": refused("deprecated by OpenAI: send `tools`", []),
    "function_call": refused("deprecated by OpenAI: send `tool_choice`"),
    "best_of": refused("a `/v1/completions` parameter only"),
    **_EXTRAS,
    "chat_template_kwargs": honoured("vLLM: extra variables for the chat template "
                                     "(`enable_thinking`, ...)"),
}

TEXT: Mapping[str, Rule] = {
    **_OPENAI,
    "prompt": honoured("a string, a list of token ids, or a list holding one of either; "
                       "several prompts are refused"),
    "max_tokens": honoured("most tokens per choice (default 16, as OpenAI's); 0 only "
                           "with `echo`"),
    "logprobs": honoured("alternatives per token, 0 to 20, with `text_offset`"),
    "echo": honoured("the prompt before each choice's text, and with `logprobs` the "
                     "prompt's tokens first (the first with a null logprob)"),
    "best_of": honoured("sample this many and return the `n` most likely"),
    "suffix": refused("insertion (fill in the middle) is not supported", ""),
    **_EXTRAS,
}


def rules_of(endpoint: str) -> Mapping[str, Rule]:
    """The classification of ``CHAT_ENDPOINT`` or ``TEXT_ENDPOINT``."""
    return CHAT if endpoint == CHAT_ENDPOINT else TEXT


def check_fields(values: Mapping[str, Any], rules: Mapping[str, Rule]) -> None:
    """400 naming the first refused field that asks for something."""
    for name, value in values.items():
        rule = rules.get(name)
        if rule is None or rule.handling is not Handling.REFUSED:
            continue
        if any(value == inert and type(value) is type(inert) for inert in rule.inert) \
                or value is None:
            continue
        raise bad_request(f"{name} is not supported: {rule.why}", name)


def markdown_table(endpoint: str) -> str:
    """The docs table of one endpoint's fields (docs/http-api.md holds it verbatim)."""
    lines = ["| field | handling | what it does, or why not |", "|---|---|---|"]
    for name, rule in rules_of(endpoint).items():
        handling = rule.handling.value
        asks = [f"`{msgspec.json.encode(v).decode()}`" for v in rule.inert if v is not None]
        if asks:
            handling += f" (unless {', '.join(asks)})"
        lines.append(f"| `{name}` | {handling} | {rule.why} |")
    return "\n".join(lines)
