"""OpenAI request bodies -> SDK keywords.

The structs declare exactly the fields ``kvrelay.gateway.fields`` classifies, and forbid
any other: an unknown field is a 400 naming it, never dropped. The bounds of every
sampling field are checked once, by ``kvrelay.protocol`` through the SDK (here too, so a
400 names the field); messages and tools by ``kvrelay.chat_inputs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kvrelay.gateway.errors import GatewayError, bad_request
from kvrelay.gateway.fields import CHAT, TEXT, Rule, check_fields
from kvrelay.gateway.messages import chat_messages
from kvrelay.gateway.output_form import CHAT as CHAT_KIND
from kvrelay.gateway.output_form import TEXT as TEXT_KIND
from kvrelay.gateway.output_form import Echo, OutputForm
from kvrelay.gateway.params import param_of
from kvrelay.gateway.tools import template_keywords
from kvrelay.protocol import SAMPLING_FIELDS, InvalidSamplingOptions, sampling_options_from

# OpenAI's default ``max_tokens`` for /v1/completions.
COMPLETIONS_MAX_TOKENS = 16


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # no-op: no padding is added


class _Common(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields both endpoints take: OpenAI's, then vLLM's extras, then kvrelay's."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    priority: int | None = None
    stop_token_ids: list[int] | None = None
    # OpenAI's structured output, and vLLM's guided decoding extras (one of them at most).
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    return_tokens_as_token_ids: bool = False
    # kvrelay: keep the job running when the caller's connection drops (to resume it).
    resumable: bool = False
    # kvrelay: false decodes this request without speculation (the SDK's keyword).
    speculative: bool | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _check(self, rules: Mapping[str, Rule]) -> None:
        """400 for a refused field that asks for something (``kvrelay.gateway.fields``)."""
        check_fields({name: getattr(self, name) for name in self.__struct_fields__}, rules)

    def sampling(self) -> dict[str, Any]:
        """The SDK keywords given (None = the wire default), checked as the SDK checks."""
        names = ("temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens",
                 "ignore_eos", "priority", "stop_token_ids", "speculative")
        options = {name: getattr(self, name) for name in names}
        if self.logit_bias is not None:
            options["logit_bias"] = dict(self.logit_bias)
        options["response_format"] = self._response_format()
        return {k: v for k, v in options.items() if v is not None}

    def _response_format(self) -> dict[str, Any] | None:
        """``response_format`` or a vLLM ``guided_*`` extra, as the SDK keyword."""
        given = {name: value for name, value in (
            ("response_format", self.response_format),
            ("guided_json", None if self.guided_json is None else {
                "type": "json_schema", "json_schema": {"name": "guided_json",
                                                       "schema": self.guided_json}}),
            ("guided_regex", None if self.guided_regex is None else {
                "type": "regex", "pattern": self.guided_regex}),
            ("guided_choice", None if self.guided_choice is None else {
                "type": "choice", "choices": self.guided_choice}),
        ) if value is not None}
        if len(given) > 1:
            raise bad_request(f"give one of {', '.join(sorted(given))}, not several",
                              "response_format")
        return next(iter(given.values()), None)


def check_sampling(options: dict[str, Any]) -> None:
    """The SDK's bounds on the sampling keywords, as a 400 naming the field."""
    try:
        sampling_options_from({k: v for k, v in options.items() if k in SAMPLING_FIELDS})
    except InvalidSamplingOptions as exc:
        message = str(exc)
        name = next((n for n in sorted(SAMPLING_FIELDS, key=len, reverse=True)
                     if message.startswith(n)), "")
        raise bad_request(message, param_of(message, name) if name else None) from None


class ChatRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Accepted, no effect (kvrelay.gateway.fields says why).
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # Refused unless they ask for nothing (kvrelay.gateway.fields).
    store: Any = None
    prompt_cache_options: Any = None
    service_tier: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    functions: Any = None
    function_call: Any = None
    best_of: Any = None

    def options(self) -> dict[str, Any]:
        self._check(CHAT)
        options = self.sampling()
        options["messages"] = chat_messages(self.messages)
        options.update(template_keywords(
            tools=self.tools, tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            chat_template_kwargs=self.chat_template_kwargs,
            reasoning_effort=self.reasoning_effort))
        if None not in (self.max_tokens, self.max_completion_tokens) \
                and self.max_tokens != self.max_completion_tokens:
            raise bad_request("give max_completion_tokens or max_tokens, not both with "
                              "different values", "max_tokens")
        limit = self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
        if limit is not None:
            options["max_tokens"] = limit
        if self.logprobs:
            options["logprobs"] = self.top_logprobs or 0
        elif self.top_logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        check_sampling(options)
        return options

    def output_form(self, *, resumed: bool = False) -> OutputForm:
        return OutputForm(kind=CHAT_KIND, include_usage=self.include_usage,
                          token_ids_as_names=self.return_tokens_as_token_ids)


class CompletionRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def _prompt(self) -> dict[str, Any]:
        """``prompt`` or ``prompt_token_ids``: one text or one list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return {"prompt": prompt}
        if prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return {"prompt_token_ids": prompt}
        if len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise bad_request(f"prompt: one prompt per request, got {len(prompt)}: send "
                              "one request each", "prompt")
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return {"prompt": prompt[0]}
        if len(prompt) == 1 and isinstance(prompt[0], list):
            return CompletionRequest(model=self.model, prompt=prompt[0])._prompt()
        raise bad_request("prompt: give a string, a list of token ids, or a list holding "
                          "one of either", "prompt")

    def _echo(self) -> Echo | None:
        if not self.echo:
            return None
        prompt = self._prompt()
        return Echo(prompt=prompt.get("prompt"), prompt_token_ids=prompt.get("prompt_token_ids"),
                    logprobs=self.logprobs is not None)

    def options(self) -> dict[str, Any]:
        self._check(TEXT)
        options = self.sampling()
        if self.best_of is not None:
            options["best_of"] = self.best_of  # bounded (>= n, <= MAX_N) by the SDK
        options.update(self._prompt())
        max_tokens = COMPLETIONS_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        options["max_tokens"] = max_tokens
        if self.logprobs is not None:
            options["logprobs"] = self.logprobs
        echo = self._echo()
        if echo is not None and (echo.needs_prompt_logprobs or not max_tokens):
            options["prompt_logprobs"] = self.logprobs or 0
        try:
            check_sampling(options)
        except GatewayError as exc:
            if exc.param == "max_tokens" and echo is None:  # the wire says prompt_logprobs
                raise bad_request(f"{exc.message}: over HTTP, send echo=true",
                                  "max_tokens") from None
            raise
        return options

    def output_form(self, *, resumed: bool = False) -> OutputForm:
        # A resumed stream has sent its echo before the point it continues from.
        return OutputForm(kind=TEXT_KIND, include_usage=self.include_usage,
                          token_ids_as_names=self.return_tokens_as_token_ids,
                          echo=None if resumed else self._echo())


def _readable(error: msgspec.ValidationError) -> tuple[str, str | None]:
    """msgspec's message as ``param: what is wrong``, with the param."""
    text = str(error)
    message, sep, where = text.rpartition(" - at ")
    if not sep:
        message, where = text, "$"
    path = where.strip("`").removeprefix("$").removeprefix(".")
    unknown = message.removeprefix("Object contains unknown field ")
    if unknown != message:
        field = unknown.strip("`")
        param = f"{path}.{field}" if path else field
        return (f"{param}: unknown field (not a parameter this gateway knows; see "
                "docs/http-api.md)", param)
    return (f"{path}: {message}" if path else message), path or None


def decode(body: bytes, kind: type[ChatRequest] | type[CompletionRequest]) -> Any:
    """Parse a JSON body; a malformed one is a 400 naming the field."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        message, param = _readable(exc)
        raise bad_request(message, param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
