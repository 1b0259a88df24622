"""The assembler on hand-written chunks in llama-server's shapes (see docs on the wire)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import orjson
import pytest

from adapters.fake_server import ROLE
from adapters.fake_server import chunk as stream_chunk
from domain.assembler import Assembler
from domain.completion import FinishReason, Timings
from domain.errors import HttpError, ProtocolError, StreamClosedEarly
from domain.events import Content, Progress, Reasoning, ToolCallDelta
from domain.messages import ToolCall

CID = "chatcmpl-0123456789abcdef0123456789abcdef"


chunk = partial(stream_chunk, cid=CID)


def feed_all(asm: Assembler, chunks: list[dict[str, Any]]) -> list[Any]:
    events: list[Any] = []
    for c in chunks:
        events.extend(asm.feed(c))
    return events


def test_plain_answer_gives_content_events_and_completion() -> None:
    asm = Assembler()
    events = feed_all(
        asm,
        [
            chunk(ROLE, progress=(20, 0, 20)),
            chunk({"content": "Hel"}, n=1, prompt_n=20),
            chunk({"content": "lo"}, n=2, prompt_n=20),
            chunk({}, finish="stop", n=3, prompt_n=20),
        ],
    )
    assert events == [Progress(20, 0, 20), Content("Hel"), Content("lo")]
    assert asm.finished
    assert asm.completion_id == CID
    done = asm.result(thinking_capped=False)
    assert done.id == CID
    assert done.content == "Hello"
    assert done.reasoning_content is None
    assert tuple(done.tool_calls) == ()
    assert done.finish_reason is FinishReason.STOP
    assert done.timings == Timings(0, 20, 3)
    assert done.reasoning_tokens == 0
    assert done.thinking_capped is False


def test_thinking_then_answer_counts_reasoning_tokens_from_predicted_n() -> None:
    asm = Assembler()
    assert asm.feed(chunk({"reasoning_content": "Let"}, n=1, prompt_n=9)) == (Reasoning("Let"),)
    assert asm.in_reasoning and asm.reasoning_tokens == 1
    asm.feed(chunk({"reasoning_content": " me"}, n=3, prompt_n=9))
    assert asm.reasoning_tokens == 3
    assert asm.feed(chunk({"content": "Hi"}, n=5, prompt_n=9)) == (Content("Hi"),)
    # Content tokens are generated after the thinking block: they do not count as reasoning.
    assert not asm.in_reasoning and asm.reasoning_tokens == 3
    asm.feed(chunk({}, finish="stop", n=6, prompt_n=9))
    done = asm.result(True)
    assert done.reasoning_content == "Let me"
    assert done.content == "Hi"
    assert done.reasoning_tokens == 3
    assert done.thinking_capped is True


def test_reasoning_without_timings_counts_one_token_per_chunk() -> None:
    asm = Assembler()
    for piece in "abc":
        asm.feed(chunk({"reasoning_content": piece}))
    assert asm.reasoning_tokens == 3


def test_streamed_tool_call_merges_by_index() -> None:
    asm = Assembler()
    first = {
        "tool_calls": [
            {"index": 0, "id": "call1", "type": "function", "function": {"name": "get_time", "arguments": '{"city":'}}
        ]
    }
    events = feed_all(
        asm,
        [
            chunk(ROLE),
            chunk(first, n=1, prompt_n=50),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Oslo"'}}]}, n=2, prompt_n=50),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, n=3, prompt_n=50),
            chunk({}, finish="tool_calls", n=3, prompt_n=50),
        ],
    )
    assert events == [
        ToolCallDelta(0, "call1", "get_time", '{"city":'),
        ToolCallDelta(0, None, None, ' "Oslo"'),
        ToolCallDelta(0, None, None, "}"),
    ]
    done = asm.result(False)
    assert list(done.tool_calls) == [ToolCall("call1", "get_time", '{"city": "Oslo"}')]
    assert done.content is None
    assert done.finish_reason is FinishReason.TOOL_CALLS


def test_several_tool_calls_come_back_in_index_order() -> None:
    asm = Assembler()
    asm.feed(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}))
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}))
    asm.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}))
    asm.feed(chunk({}, finish="tool_calls"))
    assert list(asm.result().tool_calls) == [ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}")]


def test_repeated_equal_id_and_name_are_set_once_not_concatenated() -> None:
    asm = Assembler()
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "x", "type": "function", "function": {"name": "f"}}]}))
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "x", "type": "function", "function": {"name": "f"}}]}))
    asm.feed(chunk({}, finish="tool_calls"))
    assert list(asm.result().tool_calls) == [ToolCall("x", "f", "")]


def test_a_tool_call_changing_its_id_is_a_protocol_error() -> None:
    asm = Assembler()
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f"}}]}))
    with pytest.raises(ProtocolError, match="tool call 0 changed its id from 'x' to 'y'"):
        asm.feed(chunk({"tool_calls": [{"index": 0, "id": "y"}]}))


def test_a_tool_call_that_never_names_its_function_is_a_protocol_error() -> None:
    asm = Assembler()
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "x", "function": {"arguments": "{}"}}]}))
    asm.feed(chunk({}, finish="tool_calls"))
    with pytest.raises(ProtocolError, match="never named its function"):
        asm.result()


def test_length_finish_keeps_the_partial_tool_call() -> None:
    # The server may stop on max_tokens in the middle of a call: finish_reason is "length".
    asm = Assembler()
    asm.feed(chunk({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f", "arguments": '{"a'}}]}))
    asm.feed(chunk({}, finish="length"))
    done = asm.result()
    assert done.finish_reason is FinishReason.LENGTH
    assert list(done.tool_calls) == [ToolCall("x", "f", '{"a')]


def test_role_only_and_empty_deltas_yield_nothing() -> None:
    asm = Assembler()
    assert asm.feed(chunk(ROLE)) == ()
    assert asm.feed(chunk({})) == ()
    assert asm.feed(chunk({"content": ""})) == ()
    assert asm.feed(chunk({"reasoning_content": ""})) == ()
    assert asm.feed(chunk({"tool_calls": []})) == ()
    assert not asm.in_reasoning


def test_progress_rides_with_a_role_only_delta() -> None:
    asm = Assembler()
    assert asm.feed(chunk(ROLE, progress=(100, 40, 60))) == (Progress(100, 40, 60),)
    assert asm.feed(chunk(ROLE, progress=(100, 40, 100))) == (Progress(100, 40, 100),)


def test_usage_chunk_with_empty_choices_is_accepted_and_keeps_timings() -> None:
    asm = Assembler()
    asm.feed(chunk({"content": "a"}, n=1, cache_n=1, prompt_n=2))
    asm.feed(chunk({}, finish="stop", n=2, cache_n=1, prompt_n=2))
    assert (
        asm.feed(
            {
                "choices": [],
                "id": CID,
                "usage": {"total_tokens": 5},
                "timings": {"cache_n": 1, "prompt_n": 2, "predicted_n": 2},
            }
        )
        == ()
    )
    assert asm.result().timings == Timings(1, 2, 2)


def test_latest_timings_win() -> None:
    asm = Assembler()
    asm.feed(chunk({"content": "a"}, n=1, cache_n=5, prompt_n=6))
    asm.feed(chunk({"content": "b"}, n=2, cache_n=5, prompt_n=6))
    asm.feed(chunk({}, finish="stop"))  # no timings on this one: the latest stays
    assert asm.result().timings == Timings(5, 6, 2)


def test_no_timings_at_all_gives_zeros() -> None:
    asm = Assembler()
    asm.feed(chunk({"content": "a"}))
    asm.feed(chunk({}, finish="stop"))
    assert asm.result().timings == Timings(0, 0, 0)


def test_completion_id_comes_from_the_first_chunk() -> None:
    asm = Assembler()
    first = chunk(ROLE)
    first["id"] = "chatcmpl-first"
    asm.feed(first)
    second = chunk({"content": "a"})
    del second["id"]
    asm.feed(second)
    assert asm.completion_id == "chatcmpl-first"


def test_a_chunk_of_another_generation_is_a_protocol_error() -> None:
    # One stream's chunks all carry its id: another id is another generation spliced in (a
    # re-attach answered with some other stream).
    asm = Assembler()
    first = chunk(ROLE)
    first["id"] = "chatcmpl-first"
    asm.feed(first)
    other = chunk({"content": "a"})
    other["id"] = "chatcmpl-other"
    with pytest.raises(ProtocolError) as caught:
        asm.feed(other)
    assert str(caught.value) == "chunk 2 has id 'chatcmpl-other', not the stream's 'chatcmpl-first'"


@pytest.mark.parametrize("cid", [5, 6.5, True, ["chatcmpl-x"], {"id": "chatcmpl-x"}])
def test_a_chunk_id_that_is_not_a_string_is_a_protocol_error(cid: object) -> None:
    # Ids never recorded are never compared: one of another generation would pass.
    first = chunk(ROLE)
    first["id"] = cid
    with pytest.raises(ProtocolError, match=r"^chunk 1 has id .*, not a string$"):
        Assembler().feed(first)


def test_stream_without_finish_reason_is_closed_early() -> None:
    asm = Assembler()
    asm.feed(chunk({"content": "a"}))
    assert not asm.finished
    with pytest.raises(StreamClosedEarly, match="no finish_reason after 1 chunks"):
        asm.result()


def test_empty_stream_is_closed_early() -> None:
    with pytest.raises(StreamClosedEarly):
        Assembler().result()


def test_error_chunk_raises_http_error_with_its_code_and_json() -> None:
    asm = Assembler()
    asm.feed(chunk({"content": "a"}))
    err = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    with pytest.raises(HttpError) as info:
        asm.feed(err)
    assert info.value.status == 500
    assert json.loads(info.value.body) == err


def test_error_chunk_with_503_keeps_the_status() -> None:
    with pytest.raises(HttpError) as info:
        Assembler().feed({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    assert info.value.status == 503


def test_error_chunk_without_a_code_is_a_500() -> None:
    with pytest.raises(HttpError) as info:
        Assembler().feed({"error": "something broke"})
    assert info.value.status == 500


def test_after_an_error_the_assembler_refuses_more_input_and_a_result() -> None:
    asm = Assembler()
    with pytest.raises(HttpError):
        asm.feed({"error": {"code": 500, "message": "boom"}})
    with pytest.raises(ProtocolError, match="after the stream failed"):
        asm.feed(chunk({"content": "a"}))
    with pytest.raises(ProtocolError, match="the stream failed"):
        asm.result()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (chunk({"content": 5}), "content is a int"),
        (chunk({"reasoning_content": ["x"]}), "reasoning_content is a list"),
        (chunk({}, finish="content_filter"), "unknown finish_reason 'content_filter'"),
        (chunk({"tool_calls": [{"function": {"name": "f"}}]}), "index None"),
        (chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": {}}}]}), "arguments is a dict"),
        ({"choices": [{"delta": {}}, {"delta": {}}]}, "2 choices"),
        ({"choices": "nope"}, "choices is a str, not a list"),
        ({"choices": [{"delta": "x"}]}, "malformed chunk 1"),
        ({"prompt_progress": {"total": "x"}}, r"prompt_progress\.total is 'x'"),
        (chunk({"reasoning_content": "a"}, timings={"predicted_n": "2"}), "predicted_n"),
    ],
)
def test_malformed_chunks_are_protocol_errors_naming_the_field(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Assembler().feed(bad)


def test_a_chunk_that_is_not_an_object_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="malformed chunk"):
        Assembler().feed([1, 2])  # type: ignore[arg-type]


# -- tool-call merging: empty and repeated ids, the words of the refusals, what counts against the cap ---


def call_delta(**fields: Any) -> dict[str, Any]:
    """A chunk carrying one tool-call delta, decoded from JSON as a stream's chunk is."""
    chunk = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **fields}]}}]}
    return orjson.loads(orjson.dumps(chunk))  # type: ignore[no-any-return]


FINAL = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


def test_a_later_empty_id_leaves_the_call_id_as_it_was() -> None:
    assembler = Assembler()
    assembler.feed(call_delta(id="call_1", function={"name": "get_time", "arguments": "{"}))
    assembler.feed(call_delta(id="", function={"arguments": "}"}))
    assembler.feed(FINAL)
    assert assembler.result().tool_calls == (ToolCall("call_1", "get_time", "{}"),)


def test_an_id_that_is_not_text_is_refused_naming_the_call_and_the_type() -> None:
    assembler = Assembler()
    with pytest.raises(ProtocolError) as caught:
        assembler.feed(call_delta(id=7, function={"name": "f"}))
    assert str(caught.value) == "tool call 0: id is a int, not a string"


def test_a_name_that_changes_is_refused_naming_both() -> None:
    assembler = Assembler()
    assembler.feed(call_delta(id="call_1", function={"name": "get_time"}))
    with pytest.raises(ProtocolError) as caught:
        assembler.feed(call_delta(function={"name": "get_date"}))
    assert str(caught.value) == "tool call 0 changed its name from 'get_time' to 'get_date'"


def test_an_id_sent_once_counts_once_against_the_answer_cap() -> None:
    # id (3) + name (2) + arguments (1 + 1) = 7 bytes: exactly the cap.
    assembler = Assembler(max_answer_bytes=7)
    assembler.feed(call_delta(id="abc", function={"name": "fn", "arguments": "x"}))
    assembler.feed(call_delta(function={"arguments": "y"}))
    assembler.feed(FINAL)
    assert assembler.result().tool_calls == (ToolCall("abc", "fn", "xy"),)


def test_a_repeated_equal_id_and_name_neither_count_again_nor_advance() -> None:
    assembler = Assembler(max_answer_bytes=20)
    assembler.feed(call_delta(id="call_1", function={"name": "get_time", "arguments": ""}))
    assembler.feed(call_delta(id="call_1", function={"name": "get_time", "arguments": ""}))
    assert not assembler.advanced
    assembler.feed(call_delta(id="call_1", function={"name": "get_time", "arguments": "{}"}))


@pytest.mark.parametrize("value", ["7", -1, 7.0, True])
@pytest.mark.parametrize("field", ["total", "cache", "processed"])
def test_a_progress_count_that_is_not_a_non_negative_integer_is_named_by_its_path(field: str, value: object) -> None:
    progress = {"total": 10, "cache": 0, "processed": 5, field: value}
    with pytest.raises(ProtocolError) as caught:
        Assembler().feed({"prompt_progress": progress})
    assert str(caught.value) == f"prompt_progress.{field} is {value!r}, not a non-negative integer"


@pytest.mark.parametrize("field", ["cache_n", "prompt_n", "predicted_n"])
def test_a_negative_count_in_the_timings_is_a_protocol_error_naming_it(field: str) -> None:
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": {field: -5}}
    assembler = Assembler()
    with pytest.raises(ProtocolError) as caught:
        assembler.feed(final)
        assembler.result()
    assert str(caught.value) == f"timings.{field} is -5, not a non-negative integer"


def test_a_count_of_zero_is_a_count() -> None:
    assembler = Assembler()
    assembler.feed({"prompt_progress": {"total": 0, "cache": 0, "processed": 0}})
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": {"predicted_n": 0}}
    assembler.feed(final)
    assert assembler.timings == Timings(cache_n=0, prompt_n=0, predicted_n=0)


def test_timings_missing_a_count_read_it_as_zero() -> None:
    assembler = Assembler()
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": {"predicted_n": 2}})
    assert assembler.timings == Timings(cache_n=0, prompt_n=0, predicted_n=2)


def test_a_stream_without_ids_gives_empty_ids_and_is_not_thinking_capped_unless_told() -> None:
    assembler = Assembler()
    assembler.feed(call_delta(function={"name": "get_time", "arguments": "{}"}) | {"id": None})
    assembler.feed(FINAL)
    completion = assembler.result()
    assert completion.id == ""
    assert completion.tool_calls == (ToolCall("", "get_time", "{}"),)
    assert completion.thinking_capped is False
    assert assembler.result(thinking_capped=True).thinking_capped is True


def test_a_fresh_assembler_is_not_reasoning_not_finished_and_has_not_advanced() -> None:
    assembler = Assembler()
    assert (assembler.in_reasoning, assembler.finished, assembler.advanced) == (False, False, False)


def reasoning_chunk() -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}


def test_a_tool_call_or_the_final_chunk_ends_the_thinking_block() -> None:
    assembler = Assembler()
    assembler.feed(reasoning_chunk())
    assert assembler.in_reasoning is True
    assembler.feed(call_delta(id="call_1", function={"name": "f"}))
    assert assembler.in_reasoning is False
    assembler.feed(reasoning_chunk())
    assembler.feed(FINAL)
    assert assembler.in_reasoning is False


def test_an_error_chunk_is_kept_as_compact_utf8_json() -> None:
    with pytest.raises(HttpError) as caught:
        Assembler().feed({"error": {"code": 500, "message": "café down"}})
    assert caught.value.status == 500
    assert caught.value.body == '{"error":{"code":500,"message":"café down"}}'


@pytest.mark.parametrize("first_id", ["", None])
def test_only_a_non_empty_text_id_is_taken_as_the_completion_id(first_id: object) -> None:
    assembler = Assembler()
    assembler.feed({"id": first_id, "choices": []})
    assembler.feed({"id": "chatcmpl-2", "choices": []})
    assert assembler.completion_id == "chatcmpl-2"


def test_a_malformed_chunk_is_quoted_in_at_most_123_characters() -> None:
    chunk = {"choices": [{"index": 0, "delta": "x" * 300}]}
    with pytest.raises(ProtocolError) as caught:
        Assembler().feed(chunk)
    message = str(caught.value)
    assert message.startswith("malformed chunk 1: AttributeError(")
    quote = message[message.index("{'choices'") :]
    assert quote.startswith("{'choices': [{'index': 0, 'delta': 'xxxx")
    assert len(quote) <= 123 and quote.endswith("...")


# -- the answer grows in at most PIECES_PER_TOKEN chunks a token of max_predicted (plus a slack) --


def content(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_the_answer_may_grow_in_four_chunks_a_token_and_sixteen_more() -> None:
    assembler = Assembler(max_predicted=5)
    allowed = 4 * 5 + 16
    for _ in range(allowed):
        assembler.feed(content("x"))
    with pytest.raises(ProtocolError, match=r"grew in 37 chunks, more than max_tokens=5 allows \(4 a token, plus 16\)"):
        assembler.feed(content("x"))


@pytest.mark.parametrize(
    "grows",
    [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "a"}}]}}]},
    ],
    ids=["reasoning", "tool arguments"],
)
def test_reasoning_and_tool_arguments_count_as_chunks_that_grow_the_answer(grows: dict[str, Any]) -> None:
    assembler = Assembler(max_predicted=1)
    assembler.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]})
    for _ in range(4 + 16 - 1):
        assembler.feed(grows)
    with pytest.raises(ProtocolError, match="more than max_tokens=1 allows"):
        assembler.feed(grows)


def test_chunks_that_grow_nothing_are_not_counted() -> None:
    assembler = Assembler(max_predicted=1)
    for _ in range(100):
        assembler.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        assembler.feed({"choices": [], "timings": {"predicted_n": 1}})
    for _ in range(4 + 16):
        assembler.feed(content("x"))
    assert assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) == ()
    assert assembler.result().content == "x" * 20


def test_without_max_predicted_the_chunks_are_not_bounded() -> None:
    assembler = Assembler()
    for _ in range(1000):
        assembler.feed(content("x"))
    assert assembler.advanced


@pytest.mark.parametrize(
    "bad",
    [
        {"reasoning_content": "so", "content": 7},  # a ProtocolError of the assembler's
        {"reasoning_content": "so", "tool_calls": [{"index": "x"}]},  # a TypeError inside it
    ],
)
def test_a_chunk_that_fails_appends_none_of_its_events(bad: dict[str, Any]) -> None:
    assembler = Assembler()
    out: list[object] = ["kept"]
    assembler.feed_into({"choices": [{"index": 0, "delta": {"content": "a"}}]}, out)
    assert out == ["kept", Content("a")]
    with pytest.raises(ProtocolError):
        assembler.feed_into({"prompt_progress": {"total": 3}, "choices": [{"index": 0, "delta": bad}]}, out)
    assert out == ["kept", Content("a")]  # neither the progress nor the reasoning before the fault
