"""The assembler's tool-call merging: empty and repeated ids, the words of its refusals, and what
counts against the answer cap."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from domain.assembler import Assembler
from domain.completion import Timings
from domain.errors import HttpError, ProtocolError
from domain.messages import ToolCall


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


@pytest.mark.parametrize("field", ["total", "cache", "processed"])
def test_a_progress_count_that_is_not_an_integer_is_named_by_its_path(field: str) -> None:
    progress = {"total": 10, "cache": 0, "processed": 5, field: "7"}
    with pytest.raises(ProtocolError) as caught:
        Assembler().feed({"prompt_progress": progress})
    assert str(caught.value) == f"prompt_progress.{field} is '7', not an integer"


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


@pytest.mark.parametrize("first_id", ["", 5, None])
def test_only_a_non_empty_text_id_is_taken_as_the_completion_id(first_id: object) -> None:
    assembler = Assembler()
    assembler.feed({"id": first_id, "choices": []})
    assembler.feed({"id": "chatcmpl-2", "choices": []})
    assert assembler.completion_id == "chatcmpl-2"


def test_a_malformed_chunk_is_quoted_up_to_200_characters() -> None:
    chunk = {"choices": [{"index": 0, "delta": "x" * 300}]}
    with pytest.raises(ProtocolError) as caught:
        Assembler().feed(chunk)
    assert str(caught.value).startswith("malformed chunk 1: AttributeError(")
    assert str(caught.value).endswith(": " + str(chunk)[:200])
