"""The gateway's answer objects, built from the SDK's own results: tool calls and
reasoning (whole and as stream pieces), logprob tokens named by their bytes, completions'
``text_offset``, and ``echo`` of a text prompt and of a token-id prompt."""

from __future__ import annotations

from kvrelay.completion import Choice, Completion, StreamChunk
from kvrelay.gateway.logprob_json import TextOffsets
from kvrelay.gateway.output_form import CHAT, TEXT, Echo, OutputForm
from kvrelay.gateway.responses import ChunkMaker, whole
from kvrelay.protocol import (
    FunctionCall,
    PromptLogprob,
    Timings,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

CALL = ToolCall(id="call_a", function=FunctionCall(name="get_weather",
                                                   arguments='{"city": "Paris"}'))


def completion(*choices: Choice, scored: list[PromptLogprob | None] | None = None,
               ) -> Completion:
    first = choices[0]
    return Completion(job_id="j", text=first.text, token_ids=first.token_ids,
                      finish_reason=first.finish_reason, choices=list(choices),
                      usage=Usage(prompt_tokens=3, completion_tokens=2), timings=Timings(),
                      prompt_logprobs=scored)


def test_a_choice_that_called_tools() -> None:
    done = completion(Choice(index=0, text="", token_ids=[1, 2], finish_reason="tool_calls",
                             reasoning="Paris, so get_weather.", tool_calls=[CALL]))
    choice = whole(OutputForm(kind=CHAT), done, "m", 0)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "Paris, so get_weather.",
        "tool_calls": [{"id": "call_a", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


def test_tool_call_pieces_name_the_call_once() -> None:
    maker = ChunkMaker(OutputForm(kind=CHAT), "j", "m", 0)
    thinking = maker.tokens(StreamChunk(seq=1, index=0, text="", token_ids=[1],
                                        reasoning="Paris."))
    first = maker.tokens(StreamChunk(seq=2, index=0, text="", token_ids=[2], tool_calls=[
        ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"city": ')]))
    rest = maker.tokens(StreamChunk(seq=3, index=0, text="", token_ids=[3], tool_calls=[
        ToolCallDelta(index=0, arguments='"Paris"}')]))
    assert thinking["choices"][0]["delta"] == {"role": "assistant",
                                               "reasoning_content": "Paris."}
    assert first["choices"][0]["delta"] == {"tool_calls": [
        {"index": 0, "id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": '}}]}
    assert rest["choices"][0]["delta"] == {"tool_calls": [
        {"index": 0, "function": {"arguments": '"Paris"}'}}]}
    done = completion(Choice(index=0, text="", token_ids=[1, 2, 3],
                             finish_reason="tool_calls", tool_calls=[CALL]))
    assert maker.finish(done)["choices"][0]["finish_reason"] == "tool_calls"


def lp(token_id: int, piece: bytes | None, logprob: float = -0.5) -> TokenLogprob:
    return TokenLogprob(token_id=token_id, logprob=logprob, token_bytes=piece,
                        top=[TopLogprob(token_id=token_id, logprob=logprob, token_bytes=piece)])


def test_logprob_tokens_are_their_text_and_bytes_or_their_ids() -> None:
    # "é" is two bytes, split across two byte-level tokens.
    items = [lp(5, b"caf"), lp(6, b"\xc3"), lp(7, b"\xa9!"), lp(8, None)]
    done = completion(Choice(index=0, text="café!?", token_ids=[5, 6, 7, 8], logprobs=items))
    content = whole(OutputForm(kind=CHAT), done, "m", 0)["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["caf", "\ufffd", "\ufffd!", "token_id:8"]
    assert [c["bytes"] for c in content] == [[99, 97, 102], [0xC3], [0xA9, 33], None]
    assert content[0]["top_logprobs"] == [{"token": "caf", "logprob": -0.5,
                                           "bytes": [99, 97, 102]}]
    as_ids = whole(OutputForm(kind=CHAT, token_ids_as_names=True), done, "m", 0)
    assert [c["token"] for c in as_ids["choices"][0]["logprobs"]["content"]] == [
        "token_id:5", "token_id:6", "token_id:7", "token_id:8"]

    text = whole(OutputForm(kind=TEXT), done, "m", 0)["choices"][0]["logprobs"]
    assert text["tokens"] == ["caf", "\ufffd", "\ufffd!", "token_id:8"]
    assert text["top_logprobs"][0] == {"caf": -0.5}
    # "é" starts at 3 and ends at 4; a token without bytes starts where the text so far ends.
    assert text["text_offset"] == [0, 3, 3, 5]


def test_text_offsets_continue_across_events_and_stay_inside_the_text() -> None:
    offsets = TextOffsets()
    assert offsets.of([b"ab", b"c"], "abc") == [0, 2]
    assert offsets.of([b"\xe2\x82", b"\xac"], "€") == [3, 3]
    # A stop string cut from the text: no offset points past what the caller has.
    assert offsets.of([b"x", b"STOP"], "x") == [4, 5]


SCORED: list[PromptLogprob | None] = [
    None, PromptLogprob(token_id=11, logprob=-2.0, token_bytes=b" sky",
                        top=[TopLogprob(token_id=12, logprob=-1.0, token_bytes=b" sea")])]


def test_echo_of_a_text_prompt_spells_its_first_token_from_the_rest() -> None:
    done = completion(Choice(index=0, text=" is", token_ids=[13], finish_reason="length",
                             logprobs=[lp(13, b" is", -0.25)]), scored=SCORED)
    echo = Echo(prompt="The sky", prompt_token_ids=None, logprobs=True)
    choice = whole(OutputForm(kind=TEXT, echo=echo), done, "m", 0)["choices"][0]
    assert choice["text"] == "The sky is"
    assert choice["logprobs"] == {
        "tokens": ["The", " sky", " is"],
        "token_logprobs": [None, -2.0, -0.25],
        "top_logprobs": [None, {" sea": -1.0}, {" is": -0.25}],
        "text_offset": [0, 3, 7],
    }
    without = whole(OutputForm(kind=TEXT, echo=Echo("The sky", None, logprobs=False)),
                    done, "m", 0)["choices"][0]
    assert without["text"] == "The sky is"


def test_echo_of_token_ids_is_their_text_and_streams_once_per_choice() -> None:
    echo = Echo(prompt=None, prompt_token_ids=[10, 11], logprobs=True)
    maker = ChunkMaker(OutputForm(kind=TEXT, echo=echo), "j", "m", 0)
    first = maker.tokens(StreamChunk(seq=1, index=0, text=" is", token_ids=[13],
                                     logprobs=[lp(13, b" is")], prompt_logprobs=SCORED))
    second = maker.tokens(StreamChunk(seq=2, index=0, text=" blue", token_ids=[14],
                                      logprobs=[lp(14, b" blue")]))
    assert first["choices"][0]["text"] == " sky is"
    assert first["choices"][0]["logprobs"]["tokens"] == ["token_id:10", " sky", " is"]
    assert first["choices"][0]["logprobs"]["text_offset"] == [0, 0, 4]
    assert second["choices"][0]["text"] == " blue"
    assert second["choices"][0]["logprobs"]["text_offset"] == [7]


def test_a_choice_with_no_tokens_gets_its_echo_in_the_last_chunk() -> None:
    echo = Echo(prompt="The sky", prompt_token_ids=None, logprobs=True)
    maker = ChunkMaker(OutputForm(kind=TEXT, echo=echo), "j", "m", 0)
    maker.tokens(StreamChunk(seq=1, index=0, text="", token_ids=[], prompt_logprobs=SCORED))
    done = completion(Choice(index=0, text="", token_ids=[], finish_reason="length"),
                      Choice(index=1, text="", token_ids=[], finish_reason="length"))
    last = maker.finish(done)["choices"]
    assert last[0]["text"] == ""  # choice 0 echoed with its first chunk
    assert last[1]["text"] == "The sky"
    assert last[1]["logprobs"]["token_logprobs"] == [None, -2.0]
