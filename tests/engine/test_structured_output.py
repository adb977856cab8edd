"""Structured output on a tiny random model: every constrained output is valid, 100%.

A random-weight model writes noise; only the grammar mask can make its output parse. So a
JSON schema, regex or choice that holds on every one of many seeded, temperature-1
samples shows the mask, the matcher's advance and the EOS rule work together; the same
prompts without a constraint produce no valid JSON (the mask is what did it).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import msgspec
import pytest
import torch

from kvrelay.protocol import ResponseFormat
from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.errors import SamplingParamsError
from kvrelay_worker.engine.sample.grammar import GrammarCompiler, GrammarMask, apply_grammar_mask

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_SCHEMAS = 100
PROMPT = "Reply in JSON:"
MAX_TOKENS = 400
WORDS = ["red", "green", "blue", "north", "south", "alpha", "beta", "on", "off"]


@pytest.fixture(scope="module")
def llm(folder: str) -> LLM:
    return LLM(folder, device="cpu", dtype="float32", num_kv_blocks=2048, max_num_seqs=128,
               max_num_batched_tokens=4096)


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A schema with bounded outputs: short strings, small arrays, shallow nesting."""
    kinds = ["string", "integer", "number", "enum", "boolean"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 8)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":
        return {"type": "number", "minimum": -10, "maximum": rng.choice([1, 10, 1000])}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1),
                "minItems": low, "maxItems": low + rng.randint(0, 2)}
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    names = [f"k{i}" for i in range(rng.randint(1, 4))]
    properties = {name: random_schema(rng, depth) for name in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def constrained(fmt: dict[str, Any], seed: int, **extra: Any) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
                          response_format=fmt, **extra)  # type: ignore[arg-type]


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def test_a_hundred_random_schemas_all_valid_and_stopped(llm: LLM) -> None:
    rng = random.Random(1234)
    schemas = [random_object(rng) for _ in range(NUM_SCHEMAS)]
    params = [constrained(schema_format(s), seed=i) for i, s in enumerate(schemas)]
    outputs = llm.generate([PROMPT] * len(schemas), params)
    for schema, out in zip(schemas, outputs, strict=True):
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.text)
        jsonschema.validate(json.loads(choice.text), schema)


def test_unconstrained_output_is_not_json(llm: LLM) -> None:
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40) for i in range(20)]
    outputs = llm.generate([PROMPT] * 20, params)
    parsed = 0
    for out in outputs:
        try:
            json.loads(out.text)
            parsed += 1
        except ValueError:
            pass
    assert parsed == 0


def test_regex_choice_and_json_object(llm: LLM) -> None:
    pattern = r"[a-z]{2,6}-\d{3}"
    choices = ["yes", "no", "maybe later"]
    params = ([constrained({"type": "regex", "pattern": pattern}, seed=i) for i in range(8)]
              + [constrained({"type": "choice", "choices": choices}, seed=i) for i in range(8)]
              + [constrained({"type": "json_object"}, seed=i) for i in range(4)])
    outputs = llm.generate([PROMPT] * len(params), params)
    for out in outputs[:8]:
        assert re.fullmatch(pattern, out.text), out.text
    for out in outputs[8:16]:
        assert out.text in choices
    for out in outputs[16:]:
        # Noise fills an open-ended object until max_tokens; a finished one must parse.
        if out.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)
        assert out.text.lstrip().startswith("{")


def test_n_best_of_greedy_logprobs_and_seeds(llm: LLM) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": WORDS}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    fmt = schema_format(schema)
    (multi,) = llm.generate([PROMPT], constrained(fmt, seed=3, n=3, best_of=5, logprobs=2))
    (greedy,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                      response_format=fmt))  # type: ignore[arg-type]
    (again,) = llm.generate([PROMPT], constrained(fmt, seed=3, n=3, best_of=5, logprobs=2))
    assert [c.text for c in multi.choices] == [c.text for c in again.choices]
    for choice in [*multi.choices, *greedy.choices]:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), schema)
    assert all(c.logprobs for c in multi.choices)


def test_resume_replays_delivered_tokens(llm: LLM) -> None:
    """A failover continuation: the matcher replays what was sent, the answer stays valid."""
    schema = random_object(random.Random(7))
    fmt = schema_format(schema)
    (full,) = llm.generate([PROMPT], constrained(fmt, seed=5))
    head = full.choices[0].token_ids[:4]
    engine = llm.engine
    text = engine.tokenizer.decode(head)
    engine.add_request("resume", PROMPT, constrained(fmt, seed=5), prior_outputs=[head],
                       prior_texts=[text])
    new: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.output is not None:
                new = out.output.choices[0].token_ids
    assert new == full.choices[0].token_ids  # the prior tokens, then the same continuation
    with pytest.raises(SamplingParamsError, match="do not match"):
        engine.add_request("bad", PROMPT, constrained(fmt, seed=5),
                           prior_outputs=[llm.tokenizer.encode("nope")])


def test_bad_formats_fail_alone(llm: LLM) -> None:
    with pytest.raises(SamplingParamsError, match="cannot be compiled"):
        llm.engine.add_request("r1", PROMPT, constrained({"type": "regex", "pattern": "(a"}, 1))
    with pytest.raises(SamplingParamsError, match="response_format"):
        SamplingParams(response_format={"type": "choice", "choices": []})  # type: ignore[arg-type]
    (ok,) = llm.generate([PROMPT], constrained({"type": "choice", "choices": ["x"]}, seed=0))
    assert ok.text == "x"


def test_ids_past_the_tokenizer_are_never_allowed(llm: LLM) -> None:
    """A model whose logits are wider than its tokenizer: the extra ids stay masked."""
    tokenizer = llm.tokenizer
    width = len(tokenizer) + 100
    grammars = GrammarCompiler(tokenizer, width, llm.engine.eos_token_ids)
    grammar = grammars.matcher(grammars.compile(
        msgspec.convert({"type": "json_object"}, ResponseFormat)))
    bitmask, rows = GrammarMask(width).fill([(0, grammar)], 1, torch.device("cpu"))
    logits = apply_grammar_mask(torch.zeros(1, width), bitmask, rows)
    assert torch.isinf(logits[0, len(tokenizer):]).all()
    assert torch.isfinite(logits[0, :len(tokenizer)]).any()
