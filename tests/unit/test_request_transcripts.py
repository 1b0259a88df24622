"""The request builder renders each recorded case's inputs to the request the recorder sent.

Compared as JSON values, not bytes: the recorder's key order is its own. The one pinned
difference: with no tools, the builder sends neither `tools` nor `tool_choice`, where the
recorder sent `"tools": []` and `"tool_choice": "auto"` (the template renders the same prompt
either way; the device tier checks the answers match).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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
from domain.request import RequestSettings, build_chat_body
from transcripts import TRANSCRIPTS, case_names, load_case

MISSING = "no recorded transcripts: tests/fixtures/transcripts/index.json is missing (run `make transcripts`)"
SLOTS = 2  # every recorded server runs two slots


def message_from(data: dict[str, Any]) -> ChatMessage:
    role = data["role"]
    if role == "system":
        return SystemMessage(data["content"])
    if role == "user":
        return UserMessage(data["content"])
    if role == "tool":
        return ToolMessage(data["tool_call_id"], data["content"])
    calls = [
        ToolCall(call["id"], call["function"]["name"], call["function"]["arguments"])
        for call in data.get("tool_calls") or []
    ]
    return AssistantMessage(data.get("content"), data.get("reasoning_content"), calls)


def request_from(inputs: dict[str, Any]) -> tuple[ChatRequest, RequestSettings]:
    req = ChatRequest(
        slot=inputs["slot"],
        messages=[message_from(m) for m in inputs["messages"]],
        tools=[ToolSchema(t["name"], t["description"], t["parameters"]) for t in inputs["tools"]],
        thinking=inputs["thinking"],
        tool_choice=inputs["tool_choice"],
    )
    sampling = inputs["sampling"]
    settings = RequestSettings(
        model=inputs["model"],
        max_tokens=inputs["max_tokens"],
        temperature=sampling.get("temperature"),
        top_p=sampling.get("top_p"),
        top_k=sampling.get("top_k"),
        min_p=sampling.get("min_p"),
        seed=sampling.get("seed"),
    )
    return req, settings


def _chat_cases() -> list[Any]:
    if not (TRANSCRIPTS / "index.json").exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=MISSING), id="no-transcripts")]
    return [name for name in case_names() if load_case(name).inputs is not None]


@pytest.mark.parametrize("name", _chat_cases())
def test_builder_renders_the_recorded_request(name: str) -> None:
    case = load_case(name)
    assert case.inputs is not None
    req, settings = request_from(case.inputs)
    mine = json.loads(build_chat_body(req, settings, total_slots=SLOTS))
    recorded = json.loads(case.request)
    if not case.inputs["tools"]:
        assert recorded.pop("tools") == []
        recorded.pop("tool_choice")
    assert mine == recorded


@pytest.mark.parametrize("name", _chat_cases())
def test_builder_output_is_byte_stable_for_the_recorded_inputs(name: str) -> None:
    case = load_case(name)
    assert case.inputs is not None
    first = build_chat_body(*request_from(case.inputs), total_slots=SLOTS)
    assert build_chat_body(*request_from(case.inputs), total_slots=SLOTS) == first
