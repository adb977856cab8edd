"""CPU cost of three grammar libraries for structured output: xgrammar, llguidance, outlines-core.

For each library and each constraint (three JSON schemas of increasing complexity, one regex,
one choice list) it measures:

* grammar compile time, first call and second call (a cache hit where the library caches);
* per token, along a valid output (a JSON instance written below, tokenized with SmolLM2's
  tokenizer, then EOS): the time to fill the next-token bitmask (49,152 tokens, packed int32)
  plus the time to advance the matcher with the token; p50 / p99 / mean µs;
* 16 matchers stepped one after another per decode step (as an engine with 16 constrained
  sequences would), and the library's batched fill/accept API where it has one;
* the library's helper that applies a packed bitmask to [16, 49152] float32 logits on CPU,
  against a plain eager-torch reference;
* rollback by 5 tokens (speculative decoding) and replaying 200 delivered tokens into a fresh
  matcher (a worker taking over a stream mid-answer);
* whether the constraint is enforced: an instance that breaks it (out-of-range integer, wrong
  pattern) must be rejected somewhere along its tokens.

The grammar libraries are not project dependencies. Run it from a scratch venv, never the
project's:

    python3.11 -m venv /tmp/grammar-venv
    /tmp/grammar-venv/bin/pip install torch==2.13.0    # CPU build
    /tmp/grammar-venv/bin/pip install transformers xgrammar llguidance outlines-core
    /tmp/grammar-venv/bin/python benchmarks/grammar_libs.py

A library that is not installed (or fails) is reported and skipped. Writes
``benchmarks/results/grammar_libs.json`` and prints tables.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import write_result

if TYPE_CHECKING:
    import torch

DEFAULT_TOKENIZER = "/root/.cache/kvrelay/models/smollm2-135m-instruct"
RESULTS = Path(__file__).resolve().parent / "results" / "grammar_libs.json"
BATCH = 16
ROLLBACK_K = 5
REPLAY_TOKENS = 200


# --------------------------------------------------------------------------- constraints


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "json" or "regex"
    spec: str  # JSON schema text, or a regex
    instance: str  # a valid output
    invalid: str | None  # an output that breaks the constraint, or None

    def describe(self) -> str:
        return f"{self.kind}: {self.spec[:60]}"


FLAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}

NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string"},
                "role": {"enum": ["admin", "editor", "viewer"]},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "name", "role", "tags"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer"},
                    "status": {"enum": ["pending", "shipped", "delivered", "returned"]},
                },
                "required": ["sku", "qty", "status"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["user", "items"],
    "additionalProperties": False,
}

BOUNDED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180},
        "elevation_m": {"type": "number"},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "label": {"type": "string", "maxLength": 32},
        "verified": {"type": "boolean"},
    },
    "required": ["lat", "lon", "score", "verified"],
    "additionalProperties": False,
}

STATUSES = ["pending", "shipped", "delivered", "returned"]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _nested_instance() -> dict[str, Any]:
    items = [
        {"sku": f"SKU-{1000 + 37 * i}-{chr(65 + i % 26)}", "qty": 1 + (7 * i) % 12,
         "status": STATUSES[i % len(STATUSES)]}
        for i in range(14)
    ]
    user = {"id": 4711, "name": "Grace Hopper", "role": "editor",
            "tags": ["compilers", "navy", "cobol"]}
    return {"user": user, "items": items}


CASES: list[Case] = [
    Case("flat", "json", _compact(FLAT_SCHEMA), _compact({"name": "Ada Lovelace", "age": 36}),
         _compact({"name": "Ada Lovelace", "age": "36"})),
    Case("nested", "json", _compact(NESTED_SCHEMA), _compact(_nested_instance()), None),
    Case("bounded", "json", _compact(BOUNDED_SCHEMA),
         _compact({"lat": 48.8566, "lon": 2.3522, "score": 87, "label": "Paris",
                   "verified": True}),
         _compact({"lat": 48.8566, "lon": 2.3522, "score": 150, "verified": True})),
    Case("regex", "regex", r"[A-Z]{2}-[0-9]{4}-[0-9a-f]{8}", "KV-2024-9f86d081",
         "kv-2024-9f86d081"),
    Case("choice", "regex", "(positive|negative|neutral|mixed)", "neutral", "neutrals"),
]


# --------------------------------------------------------------------------- adapters


class Adapter(ABC):
    """One library behind a common interface; every import happens in ``setup``."""

    name = ""
    dist = ""
    has_cache = False
    batch_api = "none"
    rollback_note = ""

    @abstractmethod
    def setup(self, tokenizer: Any, vocab_size: int, threads: int) -> None:
        ...

    @abstractmethod
    def compile(self, case: Case) -> Any:
        ...

    def clear_cache(self) -> None:
        return None

    @abstractmethod
    def new_matcher(self, compiled: Any) -> Any:
        ...

    @abstractmethod
    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        ...

    @abstractmethod
    def accept(self, matcher: Any, token: int) -> bool:
        ...

    @abstractmethod
    def rollback(self, matcher: Any, k: int) -> None:
        ...

    def replay(self, matcher: Any, tokens: list[int]) -> bool:
        return all(self.accept(matcher, t) for t in tokens)

    def batch_step(self, matchers: list[Any], bitmask: torch.Tensor, tokens: list[int]) -> None:
        """Only libraries with a batched API (``batch_api`` not "none") implement it."""
        raise NotImplementedError(f"{self.name} has no batched API")

    @abstractmethod
    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        ...


class XGrammar(Adapter):
    name = "xgrammar"
    dist = "xgrammar"
    has_cache = True
    batch_api = "BatchGrammarMatcher.batch_fill_next_token_bitmask + batch_accept_token"
    rollback_note = "GrammarMatcher.rollback(k), unlimited"

    def setup(self, tokenizer: Any, vocab_size: int, threads: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads, cache_enabled=True)
        self.batcher = xgrammar.BatchGrammarMatcher(max_threads=threads)

    def compile(self, case: Case) -> Any:
        if case.kind == "json":
            return self.compiler.compile_json_schema(case.spec)
        return self.compiler.compile_regex(case.spec)

    def clear_cache(self) -> None:
        self.compiler.clear_cache()

    def new_matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def rollback(self, matcher: Any, k: int) -> None:
        matcher.rollback(k)

    def batch_step(self, matchers: list[Any], bitmask: torch.Tensor, tokens: list[int]) -> None:
        self.batcher.batch_fill_next_token_bitmask(matchers, bitmask)
        self.xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)


class LLGuidance(Adapter):
    name = "llguidance"
    dist = "llguidance"
    has_cache = False
    batch_api = "LLExecutor: llguidance.torch.fill_next_token_bitmask_par + consume_token_par"
    rollback_note = "LLMatcher.rollback(k), unlimited"

    def setup(self, tokenizer: Any, vocab_size: int, threads: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.llg_torch = llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.executor = llguidance.LLExecutor(num_threads=threads)

    def compile(self, case: Case) -> Any:
        # The grammar is built when a matcher is made: that is the compile step, and no
        # compiled form is shared between matchers.
        matcher = self.llg.LLMatcher(self.tokenizer, self._grammar(case), log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return case

    def _grammar(self, case: Case) -> str:
        if case.kind == "json":
            return str(self.llg.LLMatcher.grammar_from_json_schema(case.spec))
        return str(self.llg.LLMatcher.grammar_from_regex(case.spec))

    def new_matcher(self, compiled: Any) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, self._grammar(compiled), log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        self.llg_torch.fill_next_token_bitmask(matcher, bitmask, row)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def rollback(self, matcher: Any, k: int) -> None:
        if not matcher.rollback(k):
            raise RuntimeError(matcher.get_error())

    def replay(self, matcher: Any, tokens: list[int]) -> bool:
        return bool(matcher.consume_tokens(tokens))

    def batch_step(self, matchers: list[Any], bitmask: torch.Tensor, tokens: list[int]) -> None:
        self.llg_torch.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        self.executor.consume_token_par(list(zip(matchers, tokens)))

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.llg_torch.apply_token_bitmask_inplace(logits, bitmask)


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode table (SmolLM2 is byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class OutlinesCore(Adapter):
    name = "outlines-core"
    dist = "outlines-core"
    has_cache = False
    rollback_note = "Guide.rollback_state(k), up to max_rollback (a Guide argument, default 32)"

    def setup(self, tokenizer: Any, vocab_size: int, threads: int) -> None:
        import outlines_core
        import outlines_core.kernels.torch

        self.oc = outlines_core
        self.oc_torch = outlines_core.kernels.torch
        self.eos = int(tokenizer.eos_token_id)
        decoder = _byte_decoder()
        special = set(tokenizer.all_special_ids)
        vocab: dict[bytes, list[int]] = {}
        for text, token in tokenizer.get_vocab().items():
            if token not in special:
                vocab.setdefault(bytes(decoder[c] for c in text), []).append(token)
        self.vocabulary = outlines_core.Vocabulary(self.eos, vocab)

    def compile(self, case: Case) -> Any:
        regex = case.spec
        if case.kind == "json":
            regex = self.oc.json_schema.build_regex_from_schema(case.spec)
        return self.oc.Index(regex, self.vocabulary)

    def new_matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled, max_rollback=64)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        view = bitmask[row]
        matcher.write_mask_into(view.data_ptr(), view.numel(), 4)

    def accept(self, matcher: Any, token: int) -> bool:
        # A Guide has no transition for EOS: the mask allows it in a final state, and the
        # engine stops there. Accepting it is a no-op here.
        if token == self.eos:
            return bool(matcher.is_finished())
        try:
            matcher.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def rollback(self, matcher: Any, k: int) -> None:
        matcher.rollback_state(k)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.oc_torch.apply_token_bitmask_inplace(logits, bitmask)


ADAPTERS: dict[str, Callable[[], Adapter]] = {
    "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines-core": OutlinesCore,
}


# --------------------------------------------------------------------------- measuring


def _stats(ns: Sequence[int]) -> dict[str, float]:
    values = sorted(ns)
    n = len(values)
    return {
        "n": n,
        "p50_us": values[n // 2] / 1e3,
        "p99_us": values[min(n - 1, round(0.99 * (n - 1)))] / 1e3,
        "mean_us": statistics.fmean(values) / 1e3,
    }


def _bit(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


def _allocate(rows: int, vocab_size: int) -> torch.Tensor:
    import torch

    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def measure_compile(lib: Adapter, case: Case, reps: int, budget_s: float) -> dict[str, Any]:
    first: list[int] = []
    second: list[int] = []
    deadline = time.perf_counter() + budget_s
    for _ in range(reps):
        lib.clear_cache()
        t0 = time.perf_counter_ns()
        lib.compile(case)
        t1 = time.perf_counter_ns()
        lib.compile(case)
        t2 = time.perf_counter_ns()
        first.append(t1 - t0)
        second.append(t2 - t1)
        if time.perf_counter() > deadline:
            break
    compiled = lib.compile(case)
    made: list[int] = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        lib.new_matcher(compiled)
        made.append(time.perf_counter_ns() - t0)
    return {
        "first_ms": _ms(statistics.median(first)),
        "second_ms": _ms(statistics.median(second)),
        "reps": len(first),
        "new_matcher_us": round(statistics.median(made) / 1e3, 1),
        "compiled": compiled,
    }


def walk_checked(lib: Adapter, compiled: Any, tokens: list[int], vocab_size: int) -> int:
    """Step a fresh matcher through ``tokens``; return how many were allowed by the mask and
    accepted (``len(tokens)`` when all were)."""
    bitmask = _allocate(1, vocab_size)
    matcher = lib.new_matcher(compiled)
    for i, token in enumerate(tokens):
        lib.fill(matcher, bitmask, 0)
        if not _bit(bitmask, 0, token) or not lib.accept(matcher, token):
            return i
    return len(tokens)


def measure_tokens(lib: Adapter, compiled: Any, tokens: list[int], vocab_size: int,
                   passes: int) -> dict[str, Any]:
    bitmask = _allocate(1, vocab_size)
    total: list[int] = []
    mask: list[int] = []
    accept: list[int] = []
    clock = time.perf_counter_ns
    for p in range(passes + 1):  # pass 0 is the warm-up
        matcher = lib.new_matcher(compiled)
        for token in tokens:
            t0 = clock()
            lib.fill(matcher, bitmask, 0)
            t1 = clock()
            lib.accept(matcher, token)
            t2 = clock()
            if p:
                mask.append(t1 - t0)
                accept.append(t2 - t1)
                total.append(t2 - t0)
    out = _stats(total)
    out["mask_p50_us"] = _stats(mask)["p50_us"]
    out["accept_p50_us"] = _stats(accept)["p50_us"]
    return out


def measure_batch(lib: Adapter, compiled: Any, tokens: list[int], vocab_size: int,
                  passes: int) -> dict[str, Any]:
    bitmask = _allocate(BATCH, vocab_size)
    clock = time.perf_counter_ns
    sequential: list[int] = []
    for p in range(passes + 1):
        matchers = [lib.new_matcher(compiled) for _ in range(BATCH)]
        for token in tokens:
            t0 = clock()
            for row, matcher in enumerate(matchers):
                lib.fill(matcher, bitmask, row)
                lib.accept(matcher, token)
            if p:
                sequential.append(clock() - t0)
    out: dict[str, Any] = {"sequential": _stats(sequential)}
    if lib.batch_api == "none":
        return out
    batched: list[int] = []
    for p in range(passes + 1):
        matchers = [lib.new_matcher(compiled) for _ in range(BATCH)]
        for token in tokens:
            t0 = clock()
            lib.batch_step(matchers, bitmask, [token] * BATCH)
            if p:
                batched.append(clock() - t0)
        if p == 0 and not all(_bit(bitmask, r, tokens[-1]) for r in range(BATCH)):
            raise RuntimeError("batched mask disallows the chosen token")
    out["batched"] = _stats(batched)
    return out


def measure_rollback(lib: Adapter, compiled: Any, tokens: list[int], vocab_size: int,
                     reps: int) -> dict[str, Any]:
    import torch

    at = min(len(tokens) - 1, 100)
    before = _allocate(1, vocab_size)
    after = _allocate(1, vocab_size)
    matcher = lib.new_matcher(compiled)
    for token in tokens[: at - ROLLBACK_K]:
        lib.accept(matcher, token)
    lib.fill(matcher, before, 0)
    times: list[int] = []
    for _ in range(reps):
        for token in tokens[at - ROLLBACK_K: at]:
            lib.accept(matcher, token)
        t0 = time.perf_counter_ns()
        lib.rollback(matcher, ROLLBACK_K)
        times.append(time.perf_counter_ns() - t0)
    lib.fill(matcher, after, 0)
    return {"k": ROLLBACK_K, "at_token": at, "p50_us": _stats(times)["p50_us"],
            "mask_restored": bool(torch.equal(before, after))}


def measure_replay(lib: Adapter, compiled: Any, tokens: list[int], reps: int) -> dict[str, Any]:
    prefix = tokens[:REPLAY_TOKENS]
    times: list[int] = []
    ok = True
    for _ in range(reps + 1):
        t0 = time.perf_counter_ns()
        matcher = lib.new_matcher(compiled)
        ok = lib.replay(matcher, prefix) and ok
        times.append(time.perf_counter_ns() - t0)
    return {"tokens": len(prefix), "p50_us": _stats(times[1:])["p50_us"], "accepted": ok}


def measure_apply(fn: Callable[[torch.Tensor, torch.Tensor], None], vocab_size: int,
                  reps: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(BATCH, vocab_size, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (BATCH, (vocab_size + 31) // 32),
                            dtype=torch.int32, generator=gen)
    reference = logits.clone()
    torch_reference(reference, bitmask)
    t0 = time.perf_counter_ns()
    fn(logits, bitmask)
    first = time.perf_counter_ns() - t0
    correct = bool(torch.equal(logits, reference))
    times: list[int] = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn(logits, bitmask)
        times.append(time.perf_counter_ns() - t0)
    return {"first_call_ms": _ms(first), "p50_us": _stats(times)["p50_us"], "matches_ref": correct}


def torch_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Plain eager torch: unpack the bits and ``masked_fill_``."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)
    logits.masked_fill_(allowed[:, : logits.shape[1]] == 0, float("-inf"))


def numpy_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """``numpy.unpackbits`` (little-endian bit order matches the packing) + ``masked_fill_``."""
    import numpy as np
    import torch

    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    allowed = torch.from_numpy(bits[:, : logits.shape[1]])
    logits.masked_fill_(allowed == 0, float("-inf"))


def footprint(dist: str) -> dict[str, Any]:
    """Installed size of a distribution and of each of its runtime requirements."""
    import re

    def size_mb(name: str) -> float | None:
        try:
            files = importlib.metadata.files(name) or []
        except importlib.metadata.PackageNotFoundError:
            return None
        total = 0
        for f in files:
            path = Path(str(f.locate()))
            if path.is_file():
                total += path.stat().st_size
        return round(total / 2**20, 1)

    meta = importlib.metadata.metadata(dist)
    requires = [r for r in importlib.metadata.requires(dist) or [] if "extra ==" not in r]
    deps: dict[str, float | None] = {}
    for req in requires:
        name = re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0]
        deps[name] = size_mb(name)
    return {
        "version": importlib.metadata.version(dist),
        "license": meta.json.get("license_expression") or meta.json.get("license"),
        "own_mb": size_mb(dist),
        "requires": requires,
        "requires_mb": deps,
    }


def run_library(lib: Adapter, tokenizer: Any, vocab_size: int,
                args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"footprint": footprint(lib.dist), "batch_api": lib.batch_api,
                           "rollback": lib.rollback_note, "cache": lib.has_cache, "cases": {}}
    t0 = time.perf_counter_ns()
    lib.setup(tokenizer, vocab_size, args.threads)
    out["tokenizer_setup_ms"] = _ms(time.perf_counter_ns() - t0)
    eos = int(tokenizer.eos_token_id)
    for case in CASES:
        row: dict[str, Any] = {}
        out["cases"][case.name] = row
        try:
            comp = measure_compile(lib, case, args.compile_reps, args.compile_budget)
            compiled = comp.pop("compiled")
            row["compile"] = comp
            tokens = [*tokenizer.encode(case.instance, add_special_tokens=False), eos]
            row["tokens"] = len(tokens)
            done = walk_checked(lib, compiled, tokens, vocab_size)
            if done != len(tokens):
                raise RuntimeError(f"valid instance rejected at token {done}/{len(tokens)}")
            if case.invalid is not None:
                bad = [*tokenizer.encode(case.invalid, add_special_tokens=False), eos]
                row["rejects_invalid"] = walk_checked(lib, compiled, bad, vocab_size) < len(bad)
            row["per_token"] = measure_tokens(lib, compiled, tokens, vocab_size, args.passes)
            row["batch16"] = measure_batch(lib, compiled, tokens, vocab_size, args.batch_passes)
            if len(tokens) > REPLAY_TOKENS:
                row["rollback"] = measure_rollback(lib, compiled, tokens, vocab_size, 200)
                row["replay"] = measure_replay(lib, compiled, tokens, 20)
        except Exception as exc:  # a library that cannot handle a case is a result
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"  {lib.name} {case.name}: done", file=sys.stderr, flush=True)
    try:
        out["apply"] = measure_apply(lib.apply, vocab_size, args.apply_reps)
    except Exception as exc:
        out["apply"] = {"error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
    return out


# --------------------------------------------------------------------------- report


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def report(results: dict[str, Any]) -> str:
    libs: dict[str, Any] = results["libraries"]
    out: list[str] = []
    rows = []
    for name, lib in libs.items():
        if "error" in lib:
            rows.append([name, lib["error"]] + [""] * 4)
            continue
        for case, row in lib["cases"].items():
            if "error" in row:
                rows.append([name, case, row["error"][:60], "", "", ""])
                continue
            c, t = row["compile"], row["per_token"]
            rows.append([name, case, _fmt(c["first_ms"], 2), _fmt(c["second_ms"], 2),
                         f"{row['tokens']}", f"{_fmt(t['p50_us'])} / {_fmt(t['p99_us'])} / "
                         f"{_fmt(t['mean_us'])} ({_fmt(t['mask_p50_us'])} + "
                         f"{_fmt(t['accept_p50_us'])})"])
    out.append(_table(["library", "case", "compile ms (1st)", "compile ms (2nd)", "tokens",
                       "µs/token p50 / p99 / mean (mask + accept p50)"], rows))
    rows = []
    for name, lib in libs.items():
        for case, row in lib.get("cases", {}).items():
            if "batch16" not in row:
                continue
            b = row["batch16"]
            batched = b.get("batched")
            rows.append([name, case, _fmt(b["sequential"]["p50_us"]),
                         _fmt(b["sequential"]["mean_us"]),
                         _fmt(batched["p50_us"]) if batched else "–",
                         _fmt(row.get("rejects_invalid"))])
    out.append(_table(["library", "case", "16 seq, µs/step p50", "mean", "batched API p50",
                       "rejects invalid"], rows))
    rows = []
    for name, lib in libs.items():
        nested = lib.get("cases", {}).get("nested", {})
        apply = lib.get("apply", {})
        rb, rp = nested.get("rollback", {}), nested.get("replay", {})
        rows.append([name, _fmt(apply.get("p50_us")), _fmt(apply.get("first_call_ms")),
                     _fmt(apply.get("matches_ref")), _fmt(rb.get("p50_us"), 2),
                     _fmt(rb.get("mask_restored")), _fmt(rp.get("p50_us")),
                     _fmt(lib.get("tokenizer_setup_ms"), 0)])
    for label, key in (("eager torch (shift + masked_fill_)", "torch_reference_apply"),
                       ("numpy unpackbits + masked_fill_", "numpy_reference_apply")):
        ref = results[key]
        rows.append([label, _fmt(ref["p50_us"]), _fmt(ref["first_call_ms"]),
                     _fmt(ref["matches_ref"]), "", "", "", ""])
    out.append(_table(["library", "apply [16,49152] µs", "apply 1st call ms", "same as ref",
                       f"rollback {ROLLBACK_K} µs", "mask restored",
                       f"replay {REPLAY_TOKENS} µs", "tokenizer setup ms"], rows))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    parser.add_argument("--libs", nargs="+", default=list(ADAPTERS), choices=list(ADAPTERS))
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for compilers and batched mask APIs")
    parser.add_argument("--passes", type=int, default=30, help="timed passes per instance")
    parser.add_argument("--batch-passes", type=int, default=5)
    parser.add_argument("--compile-reps", type=int, default=5)
    parser.add_argument("--compile-budget", type=float, default=20.0,
                        help="seconds of compile repetitions per case before stopping early")
    parser.add_argument("--apply-reps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    # Two of the apply helpers are torch.compile'd: a private inductor cache makes their
    # first-call time a cold compile on every run.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="grammar-libs-inductor-")
    import torch
    import transformers

    torch.set_num_threads(1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    vocab_size = len(tokenizer)
    results: dict[str, Any] = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "vocab_size": vocab_size,
        "cases": {c.name: {"kind": c.kind, "spec": c.spec, "instance": c.instance,
                           "invalid": c.invalid,
                           "tokens": len(tokenizer.encode(c.instance, add_special_tokens=False))
                           + 1} for c in CASES},
        "torch_reference_apply": measure_apply(torch_reference, vocab_size, args.apply_reps),
        "numpy_reference_apply": measure_apply(numpy_reference, vocab_size, args.apply_reps),
        "libraries": {},
    }
    for name in args.libs:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            results["libraries"][name] = run_library(ADAPTERS[name](), tokenizer, vocab_size,
                                                     args)
        except Exception as exc:
            results["libraries"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
    write_result(args.out, "grammar_libs", args, results)
    print(report(results))


if __name__ == "__main__":
    main()
