"""Messages and tools to and from OpenAI-style dicts: exact both ways, written as the request body
renders them, and every malformed dict refused naming its index and key."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import RequestError
from domain.messages import (
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.openai_form import from_openai, to_openai, tools_from_openai, tools_to_openai
from domain.request import RequestSettings, build_chat_body

SETTINGS = RequestSettings(model="m", max_tokens=64)
TOOL = ToolSchema("get_time", "The time in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})

texts = st.text(max_size=12)
calls = st.builds(ToolCall, id=texts, name=texts, arguments=texts)
messages = st.one_of(
    st.builds(SystemMessage, texts),
    st.builds(UserMessage, texts),
    st.builds(ToolMessage, texts, texts),
    st.builds(AssistantMessage, st.none() | texts, st.none() | texts, st.lists(calls, max_size=3).map(tuple)),
)
call_dicts = st.builds(
    lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}}, texts, texts, texts
)


@st.composite
def assistant_dicts(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | texts)}
    if draw(st.booleans()):
        out["reasoning_content"] = draw(texts)
    found = draw(st.lists(call_dicts, max_size=3))
    if found:
        out["tool_calls"] = found
    return out


message_dicts = st.one_of(
    st.builds(lambda c: {"role": "system", "content": c}, texts),
    st.builds(lambda c: {"role": "user", "content": c}, texts),
    st.builds(lambda i, c: {"role": "tool", "tool_call_id": i, "content": c}, texts, texts),
    assistant_dicts(),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=10,
)
tools = st.builds(ToolSchema, texts, texts, st.dictionaries(texts, json_values, max_size=4))


def body_of(history: list[ChatMessage], schemas: list[ToolSchema] | None = None) -> Any:
    req = ChatRequest(slot=0, messages=history, tools=schemas or ())
    return orjson.loads(build_chat_body(req, SETTINGS, total_slots=1))


# -- exact both ways ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=6))
def test_messages_come_back_from_their_dicts_unchanged(history: list[ChatMessage]) -> None:
    assert from_openai(to_openai(history)) == history


@settings(max_examples=300, deadline=None)
@given(st.lists(message_dicts, max_size=6))
def test_dicts_come_back_from_their_messages_unchanged(dicts: list[dict[str, Any]]) -> None:
    assert to_openai(from_openai(dicts)) == dicts


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6))
def test_the_dicts_are_the_messages_the_request_body_carries(history: list[ChatMessage]) -> None:
    assert to_openai(history) == body_of(history)["messages"]


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, max_size=6))
def test_messages_survive_their_dicts_stored_as_json(history: list[ChatMessage]) -> None:
    assert from_openai(orjson.loads(orjson.dumps(to_openai(history)))) == history


@settings(max_examples=200, deadline=None)
@given(st.lists(tools, max_size=3))
def test_tools_come_back_from_their_dicts_unchanged(schemas: list[ToolSchema]) -> None:
    assert tools_from_openai(tools_to_openai(schemas)) == schemas
    dicts = tools_to_openai(schemas)
    assert tools_to_openai(tools_from_openai(dicts)) == dicts


@settings(max_examples=100, deadline=None)
@given(st.lists(tools, min_size=1, max_size=3))
def test_the_tool_dicts_are_the_tools_the_request_body_carries(schemas: list[ToolSchema]) -> None:
    assert tools_to_openai(schemas) == body_of([UserMessage("hi")], schemas)["tools"]


def test_an_assistant_turn_with_a_tool_call_reads_as_the_openai_shape() -> None:
    call = ToolCall("call_1", "get_time", '{"city": "Oslo"}')
    history: list[ChatMessage] = [AssistantMessage(None, "Oslo, then", (call,)), ToolMessage("call_1", "12:00")]
    assert to_openai(history) == [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Oslo, then",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]


def test_an_assistant_dict_may_leave_out_or_null_what_it_does_not_hold() -> None:
    bare: list[dict[str, Any]] = [
        {"role": "assistant"},
        {"role": "assistant", "content": "hi", "reasoning_content": None, "tool_calls": None},
    ]
    assert from_openai(bare) == [AssistantMessage(), AssistantMessage("hi")]
    assert from_openai([{"role": "assistant", "content": "hi", "tool_calls": []}]) == [AssistantMessage("hi")]


def test_a_tool_call_dict_may_leave_out_its_type() -> None:
    dicts = [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}]
    assert from_openai(dicts) == [AssistantMessage(tool_calls=(ToolCall("c", "f", "{}"),))]


def test_the_dicts_written_share_nothing_with_the_tools() -> None:
    dicts = tools_to_openai([TOOL])
    dicts[0]["function"]["parameters"]["properties"]["city"]["type"] = "number"
    assert TOOL.parameters["properties"]["city"]["type"] == "string"
    read = tools_from_openai(dicts)
    dicts[0]["function"]["parameters"]["type"] = "array"
    assert read[0].parameters["type"] == "object"


# -- malformed dicts ------------------------------------------------------------------------------

FINE = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (
            {"role": "bot", "content": "hi"},
            "messages[3].role: unknown role 'bot' (one of system, user, assistant, tool)",
        ),
        ({"content": "hi"}, "messages[3].role: required key is missing"),
        ({"role": 5, "content": "hi"}, "messages[3].role: unknown role 5"),
        ({"role": "user"}, "messages[3].content: required key is missing"),
        ({"role": "user", "content": None}, "messages[3].content: must be a string, not NoneType"),
        (
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            "messages[3].content: must be a string, not list",
        ),
        (
            {"role": "user", "content": "hi", "name": "ann"},
            "messages[3].name: unknown key (this dict holds role, content)",
        ),
        ({"role": "tool", "content": "12:00"}, "messages[3].tool_call_id: required key is missing"),
        ({"role": "assistant", "reasoning_content": 1}, "messages[3].reasoning_content: must be a string, not int"),
        ({"role": "assistant", "tool_calls": "f()"}, "messages[3].tool_calls: must be a list, not str"),
        ({"role": "assistant", "tool_calls": ["f()"]}, "messages[3].tool_calls[0]: must be a dict, not str"),
        ({"role": "assistant", "tool_calls": [{"id": "c"}]}, "messages[3].tool_calls[0].function: required key is"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": 1}}}]},
            "messages[3].tool_calls[0].function.arguments: must be a string, not dict: serialise it to JSON text",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "retrieval", "function": {}}]},
            "messages[3].tool_calls[0].type: unknown tool call type 'retrieval' (only 'function')",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            "messages[3].tool_calls[0].id: required key is missing",
        ),
        ({"role": "user", "content": "hi", 1: "x"}, "messages[3][1]: unknown key"),
        ("hi", "messages[3]: must be a dict, not str"),
    ],
)
def test_a_malformed_message_dict_is_refused_naming_its_index_and_key(bad: Any, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        from_openai([FINE, FINE, FINE, bad])
    assert str(caught.value).startswith(said)


def test_messages_that_are_not_a_list_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^messages: must be a list, not dict$"):
        from_openai(FINE)  # type: ignore[arg-type]


GOOD_TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"type": "code_interpreter"}, "tools[1].type: unknown tool type 'code_interpreter' (only 'function')"),
        ({"type": "function"}, "tools[1].function: required key is missing"),
        ({"function": {"name": "f", "parameters": {}}}, "tools[1].function.description: required key is missing"),
        ({"function": {"name": "f", "description": "d"}}, "tools[1].function.parameters: required key is missing"),
        (
            {"function": {"name": "f", "description": "d", "parameters": {}, "strict": True}},
            "tools[1].function.strict: unknown key (this dict holds name, description, parameters)",
        ),
        ({"function": {"name": "f", "description": "d", "parameters": []}}, "tools[1].function.parameters: must be a"),
        (
            {"function": {"name": "f", "description": "d", "parameters": {"minimum": float("nan")}}},
            "tools[1].function.parameters.minimum must be a finite number",
        ),
        ({"function": {"description": "d", "parameters": {}}}, "tools[1].function.name: required key is missing"),
        ([], "tools[1]: must be a dict, not list"),
    ],
)
def test_a_malformed_tool_dict_is_refused_naming_its_index_and_key(bad: Any, said: str) -> None:
    with pytest.raises(ValueError) as caught:
        tools_from_openai([GOOD_TOOL, bad])
    assert str(caught.value).startswith(said)


keys = st.sampled_from(["role", "content", "reasoning_content", "tool_calls", "tool_call_id", "id", "function"])
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | texts | st.sampled_from(["system", "user", "assistant", "tool"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys | texts, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(anything, max_size=4))
def test_whatever_dicts_come_in_the_answer_is_messages_or_a_value_error(dicts: list[Any]) -> None:
    try:
        from_openai(dicts)
    except ValueError as exc:
        assert str(exc).startswith(("messages[", "messages:"))


@settings(max_examples=300, deadline=None)
@given(st.lists(anything, max_size=3))
def test_whatever_tool_dicts_come_in_the_answer_is_tools_or_a_value_error(dicts: list[Any]) -> None:
    try:
        tools_from_openai(dicts)
    except ValueError as exc:
        assert str(exc).startswith("tools[")


# -- what cannot be written -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "said"),
    [
        ([UserMessage("hi"), {"role": "user"}], "messages[1] is a dict, not one of the four message kinds"),
        ([UserMessage(5)], "messages[0].content must be a string, not int"),  # type: ignore[arg-type]
        ([AssistantMessage(tool_calls=["f()"])], "messages[0].tool_calls[0] must be a ToolCall, not str"),  # type: ignore[list-item]
        ([AssistantMessage(tool_calls="f()")], "messages[0].tool_calls must be a tuple or list of ToolCalls"),  # type: ignore[arg-type]
        ([ToolMessage(None, "12:00")], "messages[0].tool_call_id must be a string, not NoneType"),  # type: ignore[arg-type]
    ],
)
def test_a_message_no_request_could_send_is_the_request_error_chat_raises(history: Any, said: str) -> None:
    with pytest.raises(RequestError) as caught:
        to_openai(history)
    assert str(caught.value).startswith(said)
    with pytest.raises(RequestError) as sent:  # the same words as the request's own
        build_chat_body(ChatRequest(0, history), SETTINGS, total_slots=None)
    assert str(sent.value) == str(caught.value)


def test_a_tool_that_cannot_be_written_is_an_error_naming_its_place() -> None:
    with pytest.raises(RequestError, match=r"^tools\[0\] must be a ToolSchema, not dict$"):
        tools_to_openai([GOOD_TOOL])  # type: ignore[list-item]
    with pytest.raises(RequestError, match=r"^tools\[0\]\.parameters must be a JSON Schema object \(a dict\)"):
        tools_to_openai([ToolSchema("f", "d", [])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^tools\[0\]\.parameters has a key that is not a string: 1$"):
        tools_to_openai([ToolSchema("f", "d", {1: "x"})])  # type: ignore[dict-item]
