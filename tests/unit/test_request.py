"""The request builder: every field of the brief's section 3, deterministic bytes, refusals."""

from __future__ import annotations

import json
from collections.abc import Sequence
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
    with pytest.raises(RequestError, match=r"^tools\[0\]\.parameters\.x must be a finite number, not nan$"):
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


# -- each refusal names the field and the kind of value found there; the edges of what is sent -----


# No sampling settings of their own: what a request samples with is all its body carries.
PLAIN_SETTINGS = RequestSettings(model="m", max_tokens=16)
TOOL = ToolSchema(name="f", description="d", parameters={"type": "object"})


def refusal(req: ChatRequest) -> str:
    with pytest.raises(RequestError) as caught:
        build_chat_body(req, PLAIN_SETTINGS, total_slots=1)
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
        build_chat_body(ChatRequest(slot=slot, messages=[UserMessage("hi")]), PLAIN_SETTINGS, total_slots=total)
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
    assert refusal(req) == (
        "tools[0].parameters is nested more than 64 levels deep (at tools[0].parameters" + ".a" * 64 + ")"
    )


def sampled(sampling: Sampling) -> bytes:
    return build_chat_body(
        ChatRequest(slot=0, messages=[UserMessage("hi")], sampling=sampling), PLAIN_SETTINGS, total_slots=1
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
    assert b'"a":' + b"[" * 63 + b"1" + b"]" * 63 in build_chat_body(fine, PLAIN_SETTINGS, total_slots=1)
    deep = ChatRequest(slot=0, messages=[UserMessage("hi")], response_format={"type": "text", "a": nested_lists(64)})
    assert refusal(deep) == (
        "response_format is nested more than 64 levels deep (at response_format.a" + "[0]" * 63 + ")"
    )


def test_a_bad_value_in_a_list_of_a_response_format_is_named_by_its_index() -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi")], response_format={"type": "text", "enum": [1, float("nan")]})
    assert refusal(req) == "response_format.enum[1] must be a finite number, not nan"


# -- the shape of the request itself ------------------------------------------------------------


def test_a_request_that_is_not_a_chat_request_is_named_by_its_type() -> None:
    for bad in (None, {"slot": 0, "messages": []}):
        with pytest.raises(RequestError) as caught:
            build_chat_body(bad, PLAIN_SETTINGS, total_slots=1)  # type: ignore[arg-type]
        assert str(caught.value) == f"the request must be a ChatRequest, not {type(bad).__name__}"


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("messages", 5, "messages, not int"),
        ("messages", "hello", "messages, not str"),
        ("messages", (m for m in [UserMessage("hi")]), "messages, not generator"),
        ("tools", None, "ToolSchemas, not NoneType"),
        ("tools", 3, "ToolSchemas, not int"),
        ("tools", iter([TOOL]), "ToolSchemas, not list_iterator"),
    ],
)
def test_messages_and_tools_that_are_not_a_sequence_are_refused(field: str, value: Any, what: str) -> None:
    # A generator would be used up by the first render: a retry, or the cache's record of the
    # turn, would see nothing.
    fields: dict[str, Any] = {"slot": 0, "messages": [UserMessage("hi")], field: value}
    assert refusal(ChatRequest(**fields)) == f"{field} must be a tuple or list of {what}"


@pytest.mark.parametrize(("value", "kind"), [(None, "NoneType"), (5, "int"), ("c1", "str")])
def test_tool_calls_that_are_not_a_sequence_are_named_by_their_path(value: Any, kind: str) -> None:
    req = ChatRequest(slot=0, messages=[UserMessage("hi"), AssistantMessage(content="a", tool_calls=value)])
    assert refusal(req) == f"messages[1].tool_calls must be a tuple or list of ToolCalls, not {kind}"


def test_any_sequence_of_messages_renders_as_a_list_would() -> None:
    class Messages(Sequence[UserMessage]):
        def __init__(self, *items: UserMessage) -> None:
            self._items = items

        def __getitem__(self, index: Any) -> Any:
            return self._items[index]

        def __len__(self) -> int:
            return len(self._items)

    listed = ChatRequest(slot=0, messages=[UserMessage("hi")], tools=[TOOL])
    custom = ChatRequest(slot=0, messages=Messages(UserMessage("hi")), tools=(TOOL,))
    assert build_chat_body(custom, PLAIN_SETTINGS, total_slots=1) == build_chat_body(
        listed, PLAIN_SETTINGS, total_slots=1
    )
