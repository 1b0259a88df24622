"""The request builder: every field of the brief's section 3, deterministic bytes, refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from domain.messages import (
    AssistantMessage,
    ChatRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.request import RequestError, RequestSettings, build_chat_body, build_control_body

SETTINGS = RequestSettings(
    model="test-model", max_tokens=8192, temperature=0.6, top_p=0.95, top_k=20, min_p=0.0, seed=-1
)
WEATHER = ToolSchema(
    name="get_time",
    description="The time in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def body_of(req: ChatRequest, settings: RequestSettings = SETTINGS, total_slots: int | None = 2) -> Any:
    return json.loads(build_chat_body(req, settings, total_slots=total_slots))


def test_renders_every_field_in_a_fixed_order() -> None:
    req = ChatRequest(slot=1, messages=[UserMessage("hi")], tools=[WEATHER], thinking=True)
    raw = build_chat_body(req, SETTINGS, total_slots=2)
    assert raw == (
        b'{"model":"test-model","messages":[{"role":"user","content":"hi"}],'
        b'"tools":[{"type":"function","function":{"name":"get_time","description":"The time in a city.",'
        b'"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],'
        b'"tool_choice":"auto","id_slot":1,"cache_prompt":true,"stream":true,"return_progress":true,'
        b'"timings_per_token":true,"reasoning_control":true,"chat_template_kwargs":{"enable_thinking":true},'
        b'"max_tokens":8192,"temperature":0.6,"top_p":0.95,"top_k":20,"min_p":0.0,"seed":-1}'
    )


def test_same_inputs_give_the_same_bytes() -> None:
    req = ChatRequest(slot=0, messages=[SystemMessage("s"), UserMessage("u")], tools=[WEATHER])
    first = build_chat_body(req, SETTINGS, total_slots=2)
    again = ChatRequest(slot=0, messages=(SystemMessage("s"), UserMessage("u")), tools=(WEATHER,))
    assert build_chat_body(again, SETTINGS, total_slots=2) == first


def test_text_is_utf8_not_escaped() -> None:
    raw = build_chat_body(ChatRequest(slot=0, messages=[UserMessage("héllo ☃ 🦙")]), SETTINGS, total_slots=1)
    assert "héllo ☃ 🦙".encode() in raw
    assert b"\\u" not in raw


def test_four_message_kinds_render_in_openai_form() -> None:
    call = ToolCall(id="abc", name="get_time", arguments='{"city": "Oslo"}')
    req = ChatRequest(
        slot=0,
        messages=[
            SystemMessage("sys"),
            UserMessage("what time is it in Oslo?"),
            AssistantMessage(content=None, reasoning_content="think", tool_calls=[call]),
            ToolMessage(tool_call_id="abc", content="12:00"),
            AssistantMessage(content="It is noon."),
        ],
        tools=[WEATHER],
    )
    assert body_of(req)["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "what time is it in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [
                {"id": "abc", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "abc", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
    ]


def test_assistant_without_reasoning_or_calls_omits_both_keys() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("a"), AssistantMessage(content="b")])
    assistant = body_of(req)["messages"][1]
    assert assistant == {"role": "assistant", "content": "b"}


def test_empty_reasoning_content_is_sent_as_given() -> None:
    # Only None means "no reasoning"; an empty string is the caller's text and is kept.
    req = ChatRequest(slot=0, messages=[UserMessage("a"), AssistantMessage(content="b", reasoning_content="")])
    assert body_of(req)["messages"][1]["reasoning_content"] == ""


def test_trailing_assistant_message_is_sent_as_is_for_the_server_to_continue() -> None:
    prefill = '<tool_call>\n{"name": "get_time", "arguments": {"city": "'
    req = ChatRequest(slot=0, messages=[UserMessage("time?"), AssistantMessage(content=prefill)], tools=[WEATHER])
    assert body_of(req)["messages"][-1] == {"role": "assistant", "content": prefill}


def test_tool_call_arguments_stay_the_raw_text() -> None:
    raw_args = '{ "city" :"Oslo",  "x": 1.50 }'
    call = ToolCall(id="1", name="f", arguments=raw_args)
    req = ChatRequest(slot=0, messages=[UserMessage("u"), AssistantMessage(tool_calls=[call])])
    assert body_of(req)["messages"][1]["tool_calls"][0]["function"]["arguments"] == raw_args


def test_without_tools_neither_tools_nor_tool_choice_is_sent() -> None:
    body = body_of(ChatRequest(slot=0, messages=[UserMessage("u")], tool_choice="none"))
    assert "tools" not in body
    assert "tool_choice" not in body


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_tool_choice_is_sent_with_tools(choice: Any) -> None:
    body = body_of(ChatRequest(slot=0, messages=[UserMessage("u")], tools=[WEATHER], tool_choice=choice))
    assert body["tool_choice"] == choice


def test_thinking_false_is_sent_explicitly() -> None:
    body = body_of(ChatRequest(slot=0, messages=[UserMessage("u")], thinking=False))
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_flags_from_the_brief_are_always_true() -> None:
    body = body_of(ChatRequest(slot=0, messages=[UserMessage("u")]))
    for flag in ("cache_prompt", "stream", "return_progress", "timings_per_token", "reasoning_control"):
        assert body[flag] is True


def test_sampling_fields_left_unset_are_not_sent() -> None:
    settings = RequestSettings(model="m", max_tokens=16, temperature=0.0)
    body = body_of(ChatRequest(slot=0, messages=[UserMessage("u")]), settings)
    assert body["temperature"] == 0.0
    for name in ("top_p", "top_k", "min_p", "seed"):
        assert name not in body


def test_tool_parameters_keep_the_callers_key_order() -> None:
    tool = ToolSchema(name="f", description="d", parameters={"z": 1, "a": 2, "m": {"y": 0, "b": 1}})
    raw = build_chat_body(ChatRequest(slot=0, messages=[UserMessage("u")], tools=[tool]), SETTINGS, total_slots=1)
    assert b'"parameters":{"z":1,"a":2,"m":{"y":0,"b":1}}' in raw


# -- slot bounds: the server would wrap an out-of-range id_slot silently ----------------------


def test_last_slot_is_accepted() -> None:
    assert body_of(ChatRequest(slot=1, messages=[UserMessage("u")]), total_slots=2)["id_slot"] == 1


def test_slot_equal_to_the_count_is_refused() -> None:
    with pytest.raises(RequestError, match=r"slot 2 is outside the server's 2 slots \(0\.\.1\)"):
        build_chat_body(ChatRequest(slot=2, messages=[UserMessage("u")]), SETTINGS, total_slots=2)


def test_slot_far_outside_is_refused_with_the_range() -> None:
    with pytest.raises(RequestError, match=r"slot 5 is outside the server's 2 slots \(0\.\.1\)"):
        build_chat_body(ChatRequest(slot=5, messages=[UserMessage("u")]), SETTINGS, total_slots=2)


def test_negative_slot_is_refused_even_without_a_slot_count() -> None:
    with pytest.raises(RequestError, match="slot -1 is negative"):
        build_chat_body(ChatRequest(slot=-1, messages=[UserMessage("u")]), SETTINGS, total_slots=None)


def test_unknown_slot_count_skips_only_the_upper_bound() -> None:
    assert body_of(ChatRequest(slot=7, messages=[UserMessage("u")]), total_slots=None)["id_slot"] == 7


def test_bool_slot_is_refused() -> None:
    with pytest.raises(RequestError, match="slot must be an integer"):
        build_chat_body(ChatRequest(slot=True, messages=[UserMessage("u")]), SETTINGS, total_slots=2)


# -- other refusals ---------------------------------------------------------------------------


def test_empty_messages_are_refused() -> None:
    with pytest.raises(RequestError, match="at least one message"):
        build_chat_body(ChatRequest(slot=0, messages=[]), SETTINGS, total_slots=1)


def test_unknown_tool_choice_is_refused() -> None:
    # The server reads an unknown tool_choice as "auto": refuse it before it is sent.
    req = ChatRequest(slot=0, messages=[UserMessage("u")], tools=[WEATHER], tool_choice="any")  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="tool_choice 'any' is not one of auto, required, none"):
        build_chat_body(req, SETTINGS, total_slots=1)


def test_required_tool_choice_without_tools_is_refused() -> None:
    with pytest.raises(RequestError, match='"required" needs at least one tool'):
        build_chat_body(
            ChatRequest(slot=0, messages=[UserMessage("u")], tool_choice="required"), SETTINGS, total_slots=1
        )


def test_tool_call_with_non_string_arguments_is_refused() -> None:
    call = ToolCall(id="1", name="f", arguments={"city": "Oslo"})  # type: ignore[arg-type]
    req = ChatRequest(slot=0, messages=[UserMessage("u"), AssistantMessage(tool_calls=[call])])
    with pytest.raises(RequestError, match=r"messages\[1\]\.tool_calls\[0\]\.arguments must be a string, not dict"):
        build_chat_body(req, SETTINGS, total_slots=1)


def test_unknown_message_kind_is_refused() -> None:
    req = ChatRequest(slot=0, messages=[{"role": "user", "content": "u"}])  # type: ignore[list-item]
    with pytest.raises(RequestError, match=r"messages\[0\] is a dict, not one of the four message kinds"):
        build_chat_body(req, SETTINGS, total_slots=1)


def test_non_string_content_is_refused() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage(None)])  # type: ignore[arg-type]
    with pytest.raises(RequestError, match=r"messages\[0\]\.content must be a string, not NoneType"):
        build_chat_body(req, SETTINGS, total_slots=1)


def test_lone_surrogate_is_refused_not_sent_mangled() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("bad \udc80")])
    with pytest.raises(RequestError, match="not valid Unicode"):
        build_chat_body(req, SETTINGS, total_slots=1)


def test_nan_in_a_tool_schema_is_refused() -> None:
    tool = ToolSchema(name="f", description="d", parameters={"x": float("nan")})
    with pytest.raises(RequestError, match="cannot be rendered as JSON"):
        build_chat_body(ChatRequest(slot=0, messages=[UserMessage("u")], tools=[tool]), SETTINGS, total_slots=1)


def test_non_positive_max_tokens_is_refused() -> None:
    with pytest.raises(RequestError, match="max_tokens"):
        build_chat_body(ChatRequest(slot=0, messages=[UserMessage("u")]), RequestSettings("m", 0), total_slots=1)


def test_request_error_is_a_value_error() -> None:
    assert issubclass(RequestError, ValueError)


# -- control body -----------------------------------------------------------------------------


def test_control_body_ends_reasoning_for_the_completion() -> None:
    assert build_control_body("chatcmpl-abc", None) == b'{"id":"chatcmpl-abc","action":"reasoning_end"}'


def test_control_body_names_the_model_for_router_mode() -> None:
    assert build_control_body("chatcmpl-abc", "m") == b'{"id":"chatcmpl-abc","action":"reasoning_end","model":"m"}'


def test_control_body_needs_an_id() -> None:
    with pytest.raises(RequestError, match="completion id"):
        build_control_body("", "m")
