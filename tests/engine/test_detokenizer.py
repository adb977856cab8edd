"""Incremental detokenisation with SmolLM2's byte-level BPE tokenizer, and stop strings.

Streaming is simulated as the engine does it: ``add_token`` then ``take_delta`` after
every token, ``flush`` and a final ``take_delta`` when the choice ends. The reference is
``tokenizer.decode`` of the whole output. Emoji, CJK and accented text split characters
across tokens, so these cases exercise the hold-back of incomplete UTF-8.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrelay_worker.engine import LLM, SamplingParams
from kvrelay_worker.engine.sample.detokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"
TEXTS = [
    "Hello, world!",
    "naïve café résumé, Ångström, São Paulo, Zürich",
    "日本語のテキストです。中文字符测试。한국어 문장",
    "emoji 😀🎉👍🏽 family 👨\u200d👩\u200d👧 flag 🇫🇷",
    "math ∑∫√≈≠ and arrows →⇒ and ½ ¾",
    " leading space,  double  spaces\n\nnewlines\tand tabs ",
    "def f(x):\n    return x ** 2  # 🐍",
    "a . b , c ' d n't don't",
]
# Characters drawn for the property tests: ASCII, accents, CJK, emoji and a joiner.
ALPHABET = list("abcXYZ ,.!?\n") + list("éèñüß") + list("日本語中文") + ["😀", "🎉", "👍", "🏽",
                                                                    "\u200d", "€"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder)


@dataclass
class Streamed:
    deltas: list[str]  # one per token, then the final one
    stopped_at: int | None  # index of the token that completed a stop string
    final_text: str


def stream(tokenizer: Any, output_ids: Sequence[int], stop: Sequence[str] = (),
           prompt: str = "Prompt:", skip_special_tokens: bool = True) -> Streamed:
    """Feed ``output_ids`` one by one as the engine does (stopping at a stop string).

    Checks on the way that what was streamed at every step is the start of the final
    text: a streamed piece of a stop string that is cut later would break that.
    """
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), stop,
                                   skip_special_tokens)
    deltas: list[str] = []
    stopped_at = None
    for i, token in enumerate(output_ids):
        stopped = detok.add_token(token)
        deltas.append(detok.take_delta(finished=stopped))
        if stopped:
            stopped_at = i
            break
    if stopped_at is None:
        detok.flush()
        deltas.append(detok.take_delta(finished=True))
    for i in range(len(deltas)):
        assert detok.text.startswith("".join(deltas[: i + 1])), f"delta {i} streamed too much"
    return Streamed(deltas, stopped_at, detok.text)


def decode(tokenizer: Any, ids: Sequence[int], skip: bool = True) -> str:
    text: str = tokenizer.decode(list(ids), skip_special_tokens=skip)
    return text


# ------------------------------------------------------------------ plain decoding


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text)
    full = decode(tokenizer, ids)
    assert full == text
    result = stream(tokenizer, ids)
    assert "".join(result.deltas) == full
    assert result.final_text == full
    for delta in result.deltas:
        assert REPLACEMENT not in delta


def test_the_cases_split_characters_across_tokens(tokenizer: Any) -> None:
    """Guard for the test above: multi-byte characters really are split across tokens."""
    for text in TEXTS[2:4]:
        pieces = [decode(tokenizer, [t]) for t in tokenizer.encode(text)]
        assert any(REPLACEMENT in p for p in pieces), text


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(ALPHABET), min_size=1, max_size=30))
def test_random_text_streams_exactly(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text)
    result = stream(tokenizer, ids)
    assert "".join(result.deltas) == decode(tokenizer, ids) == text
    assert not any(REPLACEMENT in d for d in result.deltas)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_token_ids_stream_like_the_full_decode(tokenizer: Any,
                                                      data: st.DataObject) -> None:
    """Arbitrary ids, partial-character byte tokens among them, decode like the whole."""
    byte_tokens = sorted(set(tokenizer.encode("😀🎉👍🏽日本語中文€👨\u200d👩")))
    token = st.one_of(st.sampled_from(byte_tokens), st.integers(0, tokenizer.vocab_size - 1))
    ids = data.draw(st.lists(token, min_size=1, max_size=16))
    full = decode(tokenizer, ids)
    result = stream(tokenizer, ids)
    assert "".join(result.deltas) == full
    if REPLACEMENT not in full:
        assert not any(REPLACEMENT in d for d in result.deltas)


def test_special_tokens_are_skipped_or_kept(tokenizer: Any) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode("Hi there"), eos, *tokenizer.encode(" after")]
    skipped = stream(tokenizer, ids, skip_special_tokens=True)
    assert "".join(skipped.deltas) == decode(tokenizer, ids) == "Hi there after"
    kept = stream(tokenizer, ids, skip_special_tokens=False)
    assert "".join(kept.deltas) == decode(tokenizer, ids, skip=False)
    assert "<|im_end|>" in "".join(kept.deltas)


# ------------------------------------------------------------------ stop strings


def test_stop_string_is_cut_and_never_streamed(tokenizer: Any) -> None:
    ids = tokenizer.encode("The answer is 42. STOP and then more text")
    result = stream(tokenizer, ids, stop=["STOP"])
    assert result.final_text == "The answer is 42. "
    assert "".join(result.deltas) == result.final_text
    assert result.stopped_at is not None
    # It stopped at the token completing "STOP", not later.
    assert "STOP" in decode(tokenizer, ids[: result.stopped_at + 1])
    assert "STOP" not in decode(tokenizer, ids[: result.stopped_at])
    assert "ST" in decode(tokenizer, ids[: result.stopped_at]), "the stop spans two tokens"


def test_stop_string_spanning_several_tokens(tokenizer: Any) -> None:
    text = "first part <<END>> second part"
    ids = tokenizer.encode(text)
    pieces = [decode(tokenizer, [t]) for t in ids]
    assert not any("<<END>>" in p for p in pieces), "the stop string must span tokens"
    assert sum(1 for p in pieces if p.strip() and p.strip() in "<<END>>") >= 2
    result = stream(tokenizer, ids, stop=["<<END>>"])
    assert result.final_text == "first part "
    assert "".join(result.deltas) == "first part "
    assert not any("<" in d for d in result.deltas)


def test_a_stop_string_prefix_that_does_not_complete_is_released(tokenizer: Any) -> None:
    text = "A STAR is not a STOP sign"
    ids = tokenizer.encode(text)
    result = stream(tokenizer, ids, stop=["STOP"])
    assert result.final_text == "A STAR is not a "
    assert "".join(result.deltas) == "A STAR is not a "


def test_the_earliest_of_several_stop_strings_wins(tokenizer: Any) -> None:
    ids = tokenizer.encode("one two three four")
    result = stream(tokenizer, ids, stop=["four", "two", "three"])
    assert result.final_text == "one "
    assert "".join(result.deltas) == "one "


def test_held_back_text_is_released_when_the_choice_ends(tokenizer: Any) -> None:
    ids = tokenizer.encode("ends with ST")
    result = stream(tokenizer, ids, stop=["STOP"])
    assert result.stopped_at is None
    assert result.deltas[-1].endswith("ST")  # held back until the end
    assert "".join(result.deltas) == "ends with ST"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(["alpha", " beta", " STOP", "ST", "OP", " 日本", "😀",
                                    "\n", " é", "##", "#"]), min_size=1, max_size=12),
    stops=st.lists(st.sampled_from(["STOP", "##", "日本", "OP 😀", "\n é", "a b"]),
                   min_size=1, max_size=3),
)
def test_stop_strings_property(tokenizer: Any, words: list[str], stops: list[str]) -> None:
    """Final text is the full text cut at the first stop string; nothing past it streams."""
    text = "".join(words)
    ids = tokenizer.encode(text)
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    result = stream(tokenizer, ids, stop=stops)
    assert result.final_text == expected
    assert "".join(result.deltas) == expected
    assert (result.stopped_at is not None) == bool(hits)


def test_stop_strings_count_only_from_min_tokens_on(tokenizer: Any) -> None:
    text = "one STOP two STOP three"
    ids = tokenizer.encode(text)
    first_stop_end = next(i for i in range(len(ids)) if "STOP" in decode(tokenizer, ids[: i + 1]))
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"), ["STOP"],
                                   min_tokens=first_stop_end + 2)
    stopped_at = next(i for i, t in enumerate(ids) if detok.add_token(t))
    assert detok.text == "one STOP two "
    assert "STOP" in decode(tokenizer, ids[: stopped_at + 1])[len("one STOP"):]
    assert "STOP" not in decode(tokenizer, ids[:stopped_at])[len("one STOP"):]


# ------------------------------------------------------------------ resume


@pytest.mark.parametrize("text", [TEXTS[1], TEXTS[3], "keep going STO then STOP there"])
def test_resume_continues_where_the_earlier_attempt_left_off(tokenizer: Any,
                                                             text: str) -> None:
    stops = ["STOP"]
    ids = tokenizer.encode(text)
    whole = stream(tokenizer, ids, stop=stops)
    for k in range(1, len(ids)):
        first = stream(tokenizer, ids[:k], stop=stops)
        # What the first attempt had reported when it died: every delta but the final
        # flush (it did not finish), so held-back and incomplete text is not included.
        reported = "".join(first.deltas[:-1]) if first.stopped_at is None else None
        if reported is None:
            continue  # the stop string lies inside the first part: nothing to resume
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"), stops)
        detok.resume(ids[:k], reported)
        deltas = []
        for token in ids[k:]:
            stopped = detok.add_token(token)
            deltas.append(detok.take_delta(finished=stopped))
            if stopped:
                break
        else:
            detok.flush()
            deltas.append(detok.take_delta(finished=True))
        assert reported + "".join(deltas) == whole.final_text, f"split at token {k}"
        assert detok.text == whole.final_text


# ------------------------------------------------------------------ engine level


def test_engine_stops_on_a_stop_string(tiny_model: Callable[[str], Path]) -> None:
    """A stop string picked from the model's own greedy output ends it there."""
    llm = LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32", num_kv_blocks=64)
    prompt = list(range(1000, 1020))
    base = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    free_run = llm.generate([prompt], base)[0]
    tokenizer = llm.tokenizer
    ids = free_run.token_ids
    # A stop string spanning tokens: the last two characters before token 6 (0-based),
    # all of token 6 and the first character of token 7.
    start = len(decode(tokenizer, ids[:6]))
    end = len(decode(tokenizer, ids[:7])) + 1
    stop = free_run.text[start - 2 : end]
    assert len(stop) >= 4
    cut = free_run.text.find(stop)

    engine = llm.engine
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    engine.add_request("stop", prompt, params)
    streamed = ""
    final = None
    for _ in range(100):
        for out in engine.step():
            for delta in out.deltas:
                streamed += delta.text
                assert final is None
                if delta.finish_reason is not None:
                    assert delta.finish_reason == "stop"
            assert free_run.text[:cut].startswith(streamed)
            if out.output is not None:
                final = out.output
        if final is not None:
            break
    assert final is not None
    assert final.finish_reason == "stop"
    assert final.text == free_run.text[:cut]
    assert streamed == final.text
    # Generation ended at the token that completed the stop string.
    assert final.token_ids == ids[: len(final.token_ids)]
    assert stop in decode(tokenizer, final.token_ids)
    assert stop not in decode(tokenizer, final.token_ids[:-1])
    stats = engine.stats()
    assert stats["free_blocks"] == stats["total_blocks"]


def test_engine_ignores_stop_strings_before_min_tokens(
        tiny_model: Callable[[str], Path]) -> None:
    """Like EOS and stop ids, a stop string cannot end the output before min_tokens."""
    llm = LLM(str(tiny_model("llama-mqa")), device="cpu", dtype="float32", num_kv_blocks=64)
    prompt = list(range(1000, 1020))
    free_run = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0,
                                                     ignore_eos=True))[0]
    stop = decode(llm.tokenizer, free_run.token_ids[2:3])
    assert stop.strip()
    assert free_run.text.count(stop) == 1
    early = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0,
                                                  ignore_eos=True, stop=[stop]))[0]
    assert early.finish_reason == "stop"
    assert len(early.token_ids) == 3
    late = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0,
                                                 ignore_eos=True, stop=[stop], min_tokens=8))[0]
    assert late.finish_reason == "length"
    assert late.token_ids == free_run.token_ids
    assert late.text == free_run.text
