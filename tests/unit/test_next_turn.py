"""The next turn built from the last one: `Completion.message()` sends an answer back exactly as
a hand-built `AssistantMessage` would, and `ToolMessage.answering` pairs a result with its call."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.completion import Completion, FinishReason
from domain.messages import AssistantMessage, ChatRequest, ToolCall, ToolMessage, ToolSchema, UserMessage
from domain.request import RequestSettings, build_chat_body

SETTINGS = RequestSettings(model="m", max_tokens=64)
TOOL = ToolSchema("get_time", "The time in a city.", {"type": "object"})
CALL = ToolCall(id="call_1", name="get_time", arguments='{"city": "Oslo"}')

texts = st.text(max_size=20)
calls = st.builds(ToolCall, id=texts, name=texts, arguments=texts)
completions = st.builds(
    Completion,
    id=st.just("chatcmpl-1"),
    content=st.none() | texts,
    reasoning_content=st.none() | texts,
    tool_calls=st.lists(calls, max_size=3) | st.lists(calls, max_size=3).map(tuple),
)


def body(*messages: Any) -> bytes:
    req = ChatRequest(slot=0, messages=[UserMessage("What time is it in Oslo?"), *messages], tools=[TOOL])
    return build_chat_body(req, SETTINGS, total_slots=1)


def test_a_completions_message_holds_its_content_reasoning_and_tool_calls() -> None:
    completion = Completion("chatcmpl-1", None, "the user wants Oslo", [CALL], finish_reason=FinishReason.TOOL_CALLS)
    assert completion.message() == AssistantMessage(None, "the user wants Oslo", (CALL,))


def test_a_completions_message_holds_its_tool_calls_in_a_tuple_the_completion_cannot_change() -> None:
    held = [CALL]
    message = Completion("chatcmpl-1", None, None, held).message()
    held.append(CALL)
    assert message.tool_calls == (CALL,)


@settings(max_examples=200, deadline=None)
@given(completions)
def test_a_request_with_the_completions_message_renders_the_body_of_the_hand_built_one(completion: Completion) -> None:
    by_hand = AssistantMessage(
        content=completion.content,
        reasoning_content=completion.reasoning_content,
        tool_calls=list(completion.tool_calls),
    )
    assert body(completion.message()) == body(by_hand)


def test_a_tool_message_answering_a_call_carries_the_calls_id() -> None:
    assert ToolMessage.answering(CALL, "12:00") == ToolMessage(tool_call_id="call_1", content="12:00")


def test_a_whole_tool_turn_built_with_the_helpers_renders_the_hand_built_body() -> None:
    completion = Completion("chatcmpl-1", None, None, (CALL,), finish_reason=FinishReason.TOOL_CALLS)
    helped = body(completion.message(), ToolMessage.answering(completion.tool_calls[0], "12:00"))
    by_hand = body(AssistantMessage(tool_calls=[CALL]), ToolMessage("call_1", "12:00"))
    assert helped == by_hand


@pytest.mark.parametrize("result", [{"time": "12:00"}, ["12:00"], ("12:00",)])
def test_a_result_held_as_a_dict_or_list_is_refused_with_a_word_to_serialise_it(result: object) -> None:
    with pytest.raises(TypeError, match=r"content must be a str, not \w+: serialise the result to text"):
        ToolMessage.answering(CALL, result)  # type: ignore[arg-type]


def test_a_result_given_as_bytes_is_refused_with_a_word_to_decode_it() -> None:
    with pytest.raises(TypeError, match="content must be a str, not bytes: decode it to text first"):
        ToolMessage.answering(CALL, b"12:00")  # type: ignore[arg-type]


def test_a_result_of_another_kind_is_refused_naming_its_type() -> None:
    with pytest.raises(TypeError, match=r"^content must be a str, not int$"):
        ToolMessage.answering(CALL, 12)  # type: ignore[arg-type]


def test_answering_something_that_is_not_a_tool_call_is_refused() -> None:
    with pytest.raises(TypeError, match="call must be a ToolCall, not dict"):
        ToolMessage.answering({"id": "call_1"}, "12:00")  # type: ignore[arg-type]


def test_answering_a_call_whose_id_is_not_text_is_refused() -> None:
    with pytest.raises(TypeError, match=r"call\.id must be a str, not NoneType"):
        ToolMessage.answering(dataclasses.replace(CALL, id=None), "12:00")  # type: ignore[arg-type]
