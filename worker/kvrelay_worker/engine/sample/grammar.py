"""Structured output: ``response_format`` compiled to grammars, one matcher per sequence.

xgrammar (chosen by measurement, benchmarks/README.md) does the work. The compiler is
built once per engine, on first use, from the tokenizer with the model's logits width
as vocabulary (ids the tokenizer lacks are never allowed) and the engine's EOS ids as
stop tokens, so a matcher allows EOS only where its grammar may end. Compiled grammars
are cached by their canonical text. Each constrained sequence owns a ``SequenceGrammar``
that advances with every token appended to it; ``GrammarMask`` fills the masks of all
constrained rows of a step into one preallocated bitmask that the sampler applies to
the logits in one call.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kvrelay.protocol import (
    ChoiceFormat,
    JsonObjectFormat,
    JsonSchemaFormat,
    RegexFormat,
    ResponseFormat,
)
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.runner.transfer import host_to_device
from kvrelay_worker.engine.tools.plan import ToolPlan
from kvrelay_worker.engine.tools.tool_grammar import (
    compile_tool_grammar,
    constrains,
    tool_grammar_key,
)

log = logging.getLogger(__name__)

# Compiled grammars kept (each holds a per-token cache; a few hundred KB at most).
_CACHE_ENTRIES = 256


def canonical_text(fmt: ResponseFormat) -> str | None:
    """The cache key of a format: its kind and its constraint as sorted JSON; None: free."""
    if isinstance(fmt, JsonSchemaFormat):
        return "json_schema:" + json.dumps(fmt.json_schema.schema, sort_keys=True)
    if isinstance(fmt, JsonObjectFormat):
        return "json_object"
    if isinstance(fmt, RegexFormat):
        return "regex:" + fmt.pattern
    if isinstance(fmt, ChoiceFormat):
        return "choice:" + json.dumps(fmt.choices)
    return None


def _choice_ebnf(choices: Sequence[str]) -> str:
    # JSON string literals are valid EBNF literals for xgrammar (same escapes).
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _schema_text(fmt: JsonSchemaFormat | JsonObjectFormat) -> str:
    # OpenAI's JSON mode is an object (any members), not any JSON value.
    schema = fmt.json_schema.schema if isinstance(fmt, JsonSchemaFormat) else {"type": "object"}
    return json.dumps(schema)


def structural_part(fmt: ResponseFormat) -> dict[str, Any]:
    """A constraining format as a structural-tag format (beside tool calls)."""
    import xgrammar as xgr

    if isinstance(fmt, JsonSchemaFormat | JsonObjectFormat):
        grammar = xgr.Grammar.from_json_schema(_schema_text(fmt), any_whitespace=False)
        return {"type": "grammar", "grammar": str(grammar)}
    if isinstance(fmt, RegexFormat):
        return {"type": "regex", "pattern": fmt.pattern}
    if isinstance(fmt, ChoiceFormat):
        return {"type": "grammar", "grammar": _choice_ebnf(fmt.choices)}
    raise TypeError(f"unknown response_format {type(fmt).__name__}")


class SequenceGrammar:
    """One sequence's matcher: advanced by each appended token, asked for its mask."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        # Set when a token the mask should have excluded arrives; the sequence then ends.
        self.rejected = False

    def accept(self, token: int) -> None:
        if not self.rejected and not self.matcher.accept_token(token):
            log.error("grammar rejected token %d; ending the sequence", token)
            self.rejected = True

    def replay(self, tokens: Iterable[int]) -> bool:
        """Advance through tokens an earlier attempt delivered; False if one breaks it."""
        for token in tokens:
            self.accept(token)
        return not self.rejected

    @property
    def is_terminated(self) -> bool:
        """The grammar accepted its end (EOS where it may stop)."""
        return bool(self.matcher.is_terminated())


class GrammarCompiler:
    """The engine's compiler (built on first use) and its cache of compiled grammars."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._compiler: Any = None
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def _xgr_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._eos)
            self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        return self._compiler

    def compile(self, fmt: ResponseFormat | None, tool_plan: ToolPlan | None = None) -> Any:
        """The compiled grammar of ``fmt`` and the tool plan (None when free);
        ``SamplingParamsError`` when the schema or regex cannot be compiled, or the two
        cannot both hold: that request fails, nothing else."""
        format_key = key = canonical_text(fmt) if fmt is not None else None
        tools = tool_plan if tool_plan is not None and constrains(tool_plan) else None
        if tools is not None:
            if format_key is not None and tools.mode != "auto":
                raise SamplingParamsError(
                    f"response_format and tool_choice {tools.mode!r} cannot both hold: the "
                    "output is the tool calls; drop one of them")
            key = tool_grammar_key(tools, format_key)
        if key is None:
            return None
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        compiler = self._xgr_compiler()
        try:
            if tools is not None:
                part = structural_part(fmt) if fmt is not None and format_key else None
                compiled = compile_tool_grammar(compiler, tools, part)
            elif isinstance(fmt, JsonSchemaFormat | JsonObjectFormat):
                # Compact JSON: whitespace between tokens is never free to run on.
                compiled = compiler.compile_json_schema(_schema_text(fmt), any_whitespace=False)
            elif isinstance(fmt, RegexFormat):
                compiled = compiler.compile_regex(fmt.pattern)
            elif isinstance(fmt, ChoiceFormat):
                compiled = compiler.compile_grammar(_choice_ebnf(fmt.choices))
            else:
                raise TypeError(f"unknown response_format {type(fmt).__name__}")
        except SamplingParamsError:
            raise
        except Exception as exc:
            raise SamplingParamsError(
                f"response_format cannot be compiled: {str(exc).strip() or type(exc).__name__}"
            ) from None
        self._cache[key] = compiled
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any, prior_tokens: Sequence[int] = ()) -> SequenceGrammar:
        """A fresh matcher, advanced through ``prior_tokens`` (failover); raises
        ``SamplingParamsError`` when those tokens do not follow the grammar."""
        import xgrammar as xgr

        grammar = SequenceGrammar(xgr.GrammarMatcher(compiled))
        if not grammar.replay(prior_tokens):
            raise SamplingParamsError("the tokens already delivered do not match "
                                      "response_format or the tool calls' grammar; "
                                      "cannot resume")
        return grammar


class GrammarMask:
    """A preallocated packed bitmask ([rows, ceil(V/32)] int32), grown when a batch is larger."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None

    def fill(self, rows: Sequence[tuple[int, SequenceGrammar]], num_rows: int,
             device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """The bitmask for a step of ``num_rows`` rows and the rows it constrains."""
        import xgrammar as xgr

        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            size = max(num_rows, 2 * (self._bitmask.shape[0] if self._bitmask is not None
                                      else 8))
            self._bitmask = xgr.allocate_token_bitmask(size, self.vocab_size)
        for row, grammar in rows:
            grammar.matcher.fill_next_token_bitmask(self._bitmask, row)
        return host_to_device(self._bitmask[:num_rows], device), [row for row, _ in rows]


def apply_grammar_mask(logits: torch.Tensor, bitmask: torch.Tensor,
                       rows: list[int]) -> torch.Tensor:
    """Disallowed tokens of the constrained ``rows`` to -inf; returns a new tensor (the
    runner's logits are inference tensors, not modifiable in place here)."""
    import xgrammar as xgr

    masked = logits.clone()
    xgr.apply_token_bitmask_inplace(masked, bitmask, vocab_size=logits.shape[-1],
                                    indices=rows)
    return masked
