"""Prompt fingerprints and the prefix filter that placement matches them against."""

from __future__ import annotations

import random

import pytest

from kvrelay.prefix_filter import FILTER_BITS, MAX_ADVERTISED, PrefixFilter
from kvrelay.prefix_fingerprints import (
    CHUNK_CHARS,
    CHUNK_TOKENS,
    MAX_CHUNKS,
    prompt_fingerprints,
    request_fingerprints,
)
from kvrelay.prefix_placement import PLACEMENT_VARIABLE, placement_enabled
from kvrelay.protocol import ChatMessage, GenerateRequest

SYSTEM = "".join(random.Random(1).choice("abcdefgh ") for _ in range(4 * CHUNK_CHARS))


def test_shared_prefix_shares_leading_fingerprints_and_then_differs() -> None:
    a = prompt_fingerprints(model="m", prompt=SYSTEM + "tell me about owls" * 40)
    b = prompt_fingerprints(model="m", prompt=SYSTEM + "what is a prime?" * 40)
    assert len(a) > 4
    assert len(b) > 4
    assert a[:4] == b[:4]
    assert all(x != y for x, y in zip(a[4:], b[4:], strict=False))


def test_different_prompts_share_nothing() -> None:
    a = prompt_fingerprints(model="m", prompt="x" + SYSTEM)
    b = prompt_fingerprints(model="m", prompt="y" + SYSTEM)
    assert len(a) == len(b) == 4
    assert not set(a) & set(b)


def test_a_difference_inside_a_chunk_changes_that_chunk_and_every_later_one() -> None:
    changed = SYSTEM[:CHUNK_CHARS + 10] + "#" + SYSTEM[CHUNK_CHARS + 11:]
    a = prompt_fingerprints(model="m", prompt=SYSTEM)
    b = prompt_fingerprints(model="m", prompt=changed)
    assert a[0] == b[0]
    assert not set(a[1:]) & set(b[1:])  # chained: equal later chunks still differ


def test_only_whole_chunks_count_and_the_chain_is_bounded() -> None:
    assert prompt_fingerprints(model="m", prompt="a" * (CHUNK_CHARS - 1)) == []
    assert len(prompt_fingerprints(model="m", prompt="a" * (CHUNK_CHARS * 2 + 5))) == 2
    huge = prompt_fingerprints(model="m", prompt="ab" * CHUNK_CHARS * MAX_CHUNKS)
    assert len(huge) == MAX_CHUNKS


def test_model_salt_and_prompt_form_separate_chains() -> None:
    base = prompt_fingerprints(model="m", prompt=SYSTEM)
    assert not set(base) & set(prompt_fingerprints(model="other", prompt=SYSTEM))
    assert not set(base) & set(prompt_fingerprints(model="m", prompt=SYSTEM, cache_salt="t"))
    assert not set(base) & set(prompt_fingerprints(model="m", messages=[("user", SYSTEM)]))


def test_token_ids_chunk_by_tokens() -> None:
    ids = list(range(1000, 1000 + 3 * CHUNK_TOKENS))
    a = prompt_fingerprints(model="m", prompt_token_ids=ids)
    b = prompt_fingerprints(model="m", prompt_token_ids=ids[:2 * CHUNK_TOKENS] + [7] * 70)
    assert len(a) == 3
    assert len(b) == 3
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_conversations_sharing_a_system_prompt_share_its_chunks() -> None:
    def chat(*turns: str) -> GenerateRequest:
        messages = [ChatMessage(role="system", content=SYSTEM)]
        messages += [ChatMessage(role="user", content=turn) for turn in turns]
        return GenerateRequest(job_id="j", model="m", messages=messages)

    first = request_fingerprints(chat("hello " * 60))
    later = request_fingerprints(chat("hello " * 60, "and then " * 60))
    other = request_fingerprints(chat("bye " * 90))
    assert later[:len(first)] == first  # the next turn extends the chain
    shared = len(SYSTEM) // CHUNK_CHARS  # the chunks wholly inside the system prompt
    assert other[:shared] == first[:shared]
    assert other[shared:] != first[shared:len(other)]


def test_filter_holds_what_it_was_given_and_counts_the_leading_run() -> None:
    chain = prompt_fingerprints(model="m", prompt=SYSTEM * 2)
    other = prompt_fingerprints(model="m", prompt="z" + SYSTEM * 2)
    held = PrefixFilter(chain[:5])
    decoded = PrefixFilter.decode(held.encode())
    assert decoded.leading_matches(chain) == 5
    assert decoded.leading_matches(other) == 0
    assert len(held.encode()) == len(PrefixFilter(chain).encode())  # fixed size
    assert PrefixFilter().encode() == ""
    assert not PrefixFilter.decode("")
    assert not PrefixFilter.decode("not base64!")
    assert not PrefixFilter.decode("AAAA")  # wrong size: holds nothing


def test_filter_false_positives_stay_rare_at_its_cap() -> None:
    rng = random.Random(5)
    held = PrefixFilter(rng.getrandbits(64) for _ in range(MAX_ADVERTISED))
    probes = [rng.getrandbits(64) for _ in range(20_000)]
    rate = sum(probe in held for probe in probes) / len(probes)
    assert rate < 0.01, rate
    assert FILTER_BITS // 8 <= 2048


def test_switch_reads_the_keyword_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PLACEMENT_VARIABLE, raising=False)
    assert placement_enabled(None) is False  # off by default
    monkeypatch.setenv(PLACEMENT_VARIABLE, "false")
    assert placement_enabled(None) is False
    assert placement_enabled(True) is True
    monkeypatch.setenv(PLACEMENT_VARIABLE, "1")
    assert placement_enabled(None) is True
    assert placement_enabled(False) is False
