"""The request builder's refusals name the field and the kind of value they found there."""

from __future__ import annotations

from typing import Any

import pytest

from domain.messages import AssistantMessage, ChatRequest, ToolCall, ToolSchema, UserMessage
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
