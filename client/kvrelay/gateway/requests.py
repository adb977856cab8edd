"""OpenAI request bodies -> SDK keywords. Types only here: the bounds of every sampling
field are checked once, by ``kvrelay.protocol`` through the SDK."""

from __future__ import annotations

from typing import Any

import msgspec

from kvrelay.gateway.errors import bad_request


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None


class _Common(msgspec.Struct, kw_only=True):
    """Fields both endpoints take: OpenAI's, then vLLM's extras, then kvrelay's."""

    model: str
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
    stream: bool = False
    stream_options: StreamOptions | None = None
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
    # kvrelay: keep the job running when the caller's connection drops (to resume it).
    resumable: bool = False
    # kvrelay: false decodes this request without speculation (the SDK's keyword).
    speculative: bool | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self) -> dict[str, Any]:
        """The SDK keywords given (None = the wire default)."""
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


class ChatRequest(_Common, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # Not a chat parameter (OpenAI's legacy completions only): named to be refused, not
    # silently ignored.
    best_of: Any = None

    def options(self) -> dict[str, Any]:
        if self.best_of is not None:
            raise bad_request("best_of is only supported by /v1/completions", "best_of")
        options = self.sampling()
        options["messages"] = [{"role": m.role, "content": _text(m, i)}
                               for i, m in enumerate(self.messages)]
        limit = self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
        if limit is not None:
            options["max_tokens"] = limit
        if self.logprobs:
            options["logprobs"] = self.top_logprobs or 0
        elif self.top_logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        return options


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str | int]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def options(self) -> dict[str, Any]:
        if self.echo:
            raise bad_request("echo is not supported", "echo")
        if self.suffix:
            raise bad_request("suffix is not supported", "suffix")
        options = self.sampling()
        if self.best_of is not None:
            options["best_of"] = self.best_of  # bounded (>= n, <= MAX_N) by the SDK
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            options["prompt_token_ids"] = prompt
        elif isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise bad_request("prompt: give one string or one list of token ids", "prompt")
            options["prompt"] = prompt[0]
        else:
            options["prompt"] = prompt
        if self.max_tokens is not None:
            options["max_tokens"] = self.max_tokens
        else:
            options["max_tokens"] = 16  # OpenAI's default for completions
        if self.logprobs is not None:
            options["logprobs"] = self.logprobs
        return options


def _text(message: Message, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"messages[{index}]: only text content parts are supported",
                              "messages")
        texts.append(part.text)
    return "".join(texts)


def decode(body: bytes, kind: type[ChatRequest] | type[CompletionRequest]) -> Any:
    """Parse a JSON body; a malformed one is a 400 naming the field."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        message, _, where = text.rpartition(" - at ")
        param = where.strip("`").removeprefix("$.") if message else None
        raise bad_request(f"{param}: {message}" if message else text, param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
