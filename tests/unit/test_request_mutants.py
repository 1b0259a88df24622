"""The request builder's refusals name the field and the kind of value they found there."""

from __future__ import annotations

from typing import Any

import pytest

from domain.messages import (
    AssistantMessage,
    ChatRequest,
    Sampling,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.request import RequestError, RequestSettings, build_chat_body, build_control_body

SETTINGS = RequestSettings(model="m", max_tokens=16)
TOOL = ToolSchema(name="f", description="d", parameters={"type": "object"})


def refusal(req: ChatRequest) -> str:
    with pytest.raises(RequestError) as caught:
        build_chat_body(req, SETTINGS, total_slots=1)
    return str(caught.value)


def with_tools(*tools: Any) -> ChatRequest:
    return ChatRequest(slot=0, messages=[UserMessage("hi")], tools=tools)


def with_calls(*calls: Any) -> ChatRequest:
    return ChatRequest(slot=0, messages=[UserMessage("hi"), AssistantMessage(tool_calls=calls)])


def test_a_tool_that_is_not_a_tool_schema_is_named_by_its_index_and_type() -> None:
    assert refusal(with_tools(TOOL, {"name": "g"})) == "tools[1] must be a ToolSchema, not dict"


def test_tool_parameters_that_are_not_a_dict_are_named_by_the_tools_index() -> None:
    bad = ToolSchema(name="g", description="d", parameters=["type", "object"])  # type: ignore[arg-type]
    assert refusal(with_tools(TOOL, bad)) == "tools[1].parameters must be a JSON Schema object (a dict)"


def test_a_tool_name_that_is_not_text_is_named_by_its_path() -> None:
    bad = ToolSchema(name=7, description="d", parameters={})  # type: ignore[arg-type]
    assert refusal(with_tools(bad)) == "tools[0].name must be a string, not int"


def test_a_tool_call_that_is_not_a_tool_call_is_named_by_its_path_and_type() -> None:
    assert refusal(with_calls({"id": "c"})) == "messages[1].tool_calls[0] must be a ToolCall, not dict"


@pytest.mark.parametrize("field", ["id", "name"])
def test_a_tool_call_field_that_is_not_text_is_named_by_its_path(field: str) -> None:
    fields: dict[str, Any] = {"id": "c1", "name": "f", "arguments": "{}", field: 3}
    ok = ToolCall(id="c0", name="f", arguments="{}")
    assert refusal(with_calls(ok, ToolCall(**fields))) == f"messages[1].tool_calls[1].{field} must be a string, not int"


def test_the_control_call_without_an_id_says_what_it_needs() -> None:
    with pytest.raises(RequestError) as caught:
        build_control_body("", None)
    assert str(caught.value) == "the control call needs the completion id of the running stream"


def test_a_control_call_id_that_is_not_valid_unicode_is_refused_as_the_control_call() -> None:
    with pytest.raises(RequestError) as caught:
        build_control_body("chatcmpl-\ud800", None)
    assert str(caught.value) == "the control call holds text that is not valid Unicode (surrogates not allowed)"


def test_a_tool_description_that_is_not_text_is_named_by_its_path() -> None:
    bad = ToolSchema(name="g", description=None, parameters={})  # type: ignore[arg-type]
    assert refusal(with_tools(TOOL, bad)) == "tools[1].description must be a string, not NoneType"


def test_an_empty_request_is_refused_in_so_many_words() -> None:
    assert refusal(ChatRequest(slot=0, messages=[])) == "a request needs at least one message"


def test_required_tool_choice_without_tools_is_refused_in_so_many_words() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")], tool_choice="required")
    assert refusal(req) == 'tool_choice "required" needs at least one tool'


def test_thinking_that_is_not_a_bool_is_refused_naming_its_type() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")], thinking="yes")  # type: ignore[arg-type]
    assert refusal(req) == "thinking must be a bool, not str"


def test_a_slot_that_is_not_an_integer_is_refused_naming_its_type() -> None:
    assert refusal(ChatRequest(slot="0", messages=[UserMessage("hi")])) == "slot must be an integer, not str"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("slot", "total", "message"),
    [
        (1, 1, "slot 1 is outside the server's 1 slots (0..0)"),
        (0, 0, "slot 0 is outside the server's 0 slots (none)"),
    ],
)
def test_a_slot_out_of_range_is_refused_with_the_range_there_is(slot: int, total: int, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        build_chat_body(ChatRequest(slot=slot, messages=[UserMessage("hi")]), SETTINGS, total_slots=total)
    assert str(caught.value) == message


def test_max_tokens_of_one_is_sent() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")])
    body = build_chat_body(req, RequestSettings(model="m", max_tokens=1), total_slots=1)
    assert b'"max_tokens":1' in body


@pytest.mark.parametrize("max_tokens", [True, 1.5, 0])
def test_max_tokens_that_is_not_a_positive_integer_is_refused(max_tokens: object) -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")])
    with pytest.raises(RequestError) as caught:
        build_chat_body(req, RequestSettings(model="m", max_tokens=max_tokens), total_slots=1)  # type: ignore[arg-type]
    assert str(caught.value).startswith("max_tokens must be a positive integer")
    assert str(caught.value).endswith(f", not {max_tokens!r}")


@pytest.mark.parametrize(
    ("message", "path"),
    [
        (SystemMessage(5), "messages[1].content"),  # type: ignore[arg-type]
        (AssistantMessage(content=5), "messages[1].content"),  # type: ignore[arg-type]
        (AssistantMessage(reasoning_content=5), "messages[1].reasoning_content"),  # type: ignore[arg-type]
        (ToolMessage(tool_call_id=5, content="x"), "messages[1].tool_call_id"),  # type: ignore[arg-type]
        (ToolMessage(tool_call_id="c", content=5), "messages[1].content"),  # type: ignore[arg-type]
    ],
)
def test_message_text_that_is_not_a_string_is_named_by_its_path(message: object, path: str) -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi"), message])  # type: ignore[list-item]
    assert refusal(req) == f"{path} must be a string, not int"


def test_parameters_nested_too_deeply_are_refused_not_crashed_on() -> None:
    nested: dict[str, object] = {}
    for _ in range(100_000):
        nested = {"a": nested}
    req = with_tools(ToolSchema(name="f", description="d", parameters=nested))
    assert refusal(req) == "the request is nested too deeply to render as JSON"


def sampled(sampling: Sampling) -> bytes:
    return build_chat_body(
        ChatRequest(slot=0, messages=[UserMessage("hi")], sampling=sampling), SETTINGS, total_slots=1
    )


def test_integer_sampling_settings_take_both_ends_of_their_range() -> None:
    assert sampled(Sampling(top_k=0, seed=-1)).endswith(b'"top_k":0,"seed":-1}')
    assert sampled(Sampling(top_k=2**31 - 1, seed=2**32 - 1)).endswith(b'"top_k":2147483647,"seed":4294967295}')


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (Sampling(top_k=-1), "sampling.top_k must be from 0 to 2147483647, not -1"),
        (Sampling(top_k=2**31), "sampling.top_k must be from 0 to 2147483647, not 2147483648"),
        (Sampling(seed=-2), "sampling.seed must be from -1 to 4294967295, not -2"),
        (Sampling(seed=2**32), "sampling.seed must be from -1 to 4294967295, not 4294967296"),
    ],
)
def test_integer_sampling_settings_past_either_end_are_refused(sampling: Sampling, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        sampled(sampling)
    assert str(caught.value) == message


def nested_lists(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_response_format_nested_in_lists_up_to_the_limit_is_sent_and_one_level_more_is_refused() -> None:
    # The format object is level 0, so 63 lists inside it reach level 63, the deepest allowed.
    fine = ChatRequest(slot=0, messages=[UserMessage("hi")], response_format={"type": "text", "a": nested_lists(63)})
    assert b'"a":' + b"[" * 63 + b"1" + b"]" * 63 in build_chat_body(fine, SETTINGS, total_slots=1)
    deep = ChatRequest(slot=0, messages=[UserMessage("hi")], response_format={"type": "text", "a": nested_lists(64)})
    assert refusal(deep) == (
        "response_format is nested more than 64 levels deep (at response_format.a" + "[0]" * 63 + ")"
    )


def test_a_bad_value_in_a_list_of_a_response_format_is_named_by_its_index() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")], response_format={"type": "text", "enum": [1, float("nan")]})
    assert refusal(req) == "response_format.enum[1] must be a finite number, not nan"
