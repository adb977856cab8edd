"""Chat messages to prompt token ids through the model's own chat template.

The template gets what transformers' ``apply_chat_template`` gives it: the messages
(shaped by ``chat_messages``), ``tools`` as OpenAI function dicts, ``add_generation_prompt``
and, as further template variables, a request's ``chat_template_kwargs`` and its
``reasoning_effort``. A template variable the template never reads is refused rather
than dropped (the caller asked for something the model cannot give), and so is a key
that names one of the renderer's own arguments (``messages``, ``tools``, ``tokenize``, ...).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from kvrelay.protocol import ToolSpec
from kvrelay_worker.engine.chat_messages import template_knows_tool_calls, template_messages
from kvrelay_worker.engine.errors import InvalidPromptError

# Arguments of transformers' apply_chat_template and variables the renderer sets itself:
# a template kwarg may not replace them (the tokenizer's own signature adds its version's).
_RESERVED = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "kwargs",
})
# transformers' ``{% generation %}`` tags, unknown to a plain Jinja parser.
_GENERATION_TAG = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")


def tool_dicts(tools: Sequence[ToolSpec | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tools as the OpenAI function dicts templates render (``{"type": "function",
    "function": {"name", "description", "parameters", ...}}``)."""
    shaped = []
    for i, tool in enumerate(tools):
        raw = msgspec.to_builtins(tool) if isinstance(tool, ToolSpec) else tool
        function = raw.get("function") if isinstance(raw, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidPromptError(f"tool {i} must be {{type: function, function: {{name, ...}}}}")
        shaped.append({"type": "function", "function": dict(function)})
    return shaped


def template_text(tokenizer: Any, with_tools: bool = False) -> str | None:
    """The template the tokenizer renders with (the ``tool_use`` one of a named set when
    tools are given, as transformers picks), or None."""
    pick = getattr(tokenizer, "get_chat_template", None)
    if callable(pick):
        try:
            return str(pick(None, [{}] if with_tools else None))
        except (ValueError, TypeError):
            return None
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) and template else None


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str] | None:
    """Variables the template reads from its caller; None when it cannot be parsed here."""
    import jinja2
    import jinja2.meta

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        parsed = env.parse(_GENERATION_TAG.sub("", template))
    except jinja2.TemplateSyntaxError:
        return None
    return frozenset(jinja2.meta.find_undeclared_variables(parsed))


def template_variables_for(tokenizer: Any, kwargs: Mapping[str, Any] | None,
                           reasoning_effort: str | None, with_tools: bool) -> dict[str, Any]:
    """The extra template variables, checked: no renderer argument replaced, none that
    the template does not read."""
    extra = dict(kwargs or {})
    if reasoning_effort is not None:
        if "reasoning_effort" in extra and extra["reasoning_effort"] != reasoning_effort:
            raise InvalidPromptError("reasoning_effort is given twice, differently (also in "
                                     "chat_template_kwargs)")
        extra["reasoning_effort"] = reasoning_effort
    if not extra:
        return extra
    reserved = _RESERVED | _signature_names(tokenizer)
    clash = sorted(k for k in extra if k in reserved)
    if clash:
        raise InvalidPromptError(f"chat_template_kwargs may not set {clash}: the renderer "
                                 "sets them itself")
    template = template_text(tokenizer, with_tools)
    read = template_variables(template) if template is not None else None
    if read is not None:
        unread = sorted(k for k in extra if k not in read)
        if unread:
            raise InvalidPromptError(f"this model's chat template does not read {unread}: "
                                     "the model would never see them")
    return extra


def _signature_names(tokenizer: Any) -> frozenset[str]:
    try:
        parameters = inspect.signature(tokenizer.apply_chat_template).parameters
    except (TypeError, ValueError, AttributeError):
        return frozenset()
    return frozenset(name for name, p in parameters.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def render_chat(tokenizer: Any, messages: object, *, add_generation_prompt: bool = True,
                tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None,
                template_kwargs: Mapping[str, Any] | None = None,
                reasoning_effort: str | None = None) -> str:
    """The prompt text: ``messages`` (and ``tools``, template variables) through the
    tokenizer's chat template; ``InvalidPromptError`` for anything it cannot take."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidPromptError("this model has no chat template; send a plain prompt instead")
    with_tools = bool(tools)
    shaped = template_messages(
        messages, template_knows_tool_calls(template_text(tokenizer, with_tools)))
    extra = template_variables_for(tokenizer, template_kwargs, reasoning_effort, with_tools)
    if with_tools:
        extra["tools"] = tool_dicts(tools or ())
    text = tokenizer.apply_chat_template(shaped, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, **extra)
    return str(text)


def apply_chat_template(tokenizer: Any, messages: object, add_generation_prompt: bool = True,
                        *, tools: Sequence[ToolSpec | Mapping[str, Any]] | None = None,
                        template_kwargs: Mapping[str, Any] | None = None,
                        reasoning_effort: str | None = None) -> list[int]:
    """Render ``messages`` with the tokenizer's template and return the prompt token ids."""
    text = render_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt,
                       tools=tools, template_kwargs=template_kwargs,
                       reasoning_effort=reasoning_effort)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids
