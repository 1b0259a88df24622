"""The public value types keep the names and shapes that other code imports."""

from __future__ import annotations

import dataclasses

import pytest

from domain.completion import Completion, FinishReason, Timings
from domain.errors import (
    Busy,
    ConnectError,
    HttpError,
    InferError,
    LoadTimeout,
    ProtocolError,
    Stalled,
    StreamClosedEarly,
    ThinkingOverrun,
    WaitTimeout,
)
from domain.events import (
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallDelta,
    Waiting,
)
from domain.messages import (
    AssistantMessage,
    ChatRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSchema,
    UserMessage,
)


def test_every_error_variant_is_an_infer_error() -> None:
    for cls in (
        Busy,
        ConnectError,
        WaitTimeout,
        LoadTimeout,
        Stalled,
        StreamClosedEarly,
        ThinkingOverrun,
        HttpError,
        ProtocolError,
    ):
        assert issubclass(cls, InferError)
    assert issubclass(InferError, Exception)


def test_http_error_keeps_status_and_body_unchanged_when_small() -> None:
    body = '{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size"}}'
    err = HttpError(400, body)
    assert err.status == 400
    assert err.body == body
    assert "400" in str(err)


def test_http_error_body_is_capped_at_4_kib() -> None:
    err = HttpError(500, b"x" * 10_000)
    assert len(err.body.encode()) == 4096
    assert HttpError(500, "y" * 5000, limit=100).body == "y" * 100


def test_busy_names_the_slot_and_queue() -> None:
    err = Busy(slot=1, queued=8)
    assert (err.slot, err.queued) == (1, 8)
    assert "slot 1" in str(err)


def test_events_are_frozen_with_the_briefs_field_names() -> None:
    events = [
        Queued(ahead=2),
        Waiting(slot_busy=True),
        Progress(total=10, cache=2, processed=5),
        Reasoning(text="r"),
        Content(text="c"),
        ToolCallDelta(index=0, id="a", name="f", arguments="{"),
        ThinkingCapped(tokens=4096),
        Retrying(attempt=1, after_ms=2000, error="x"),
    ]
    fields = {type(e).__name__: [f.name for f in dataclasses.fields(e)] for e in events}
    assert fields == {
        "Queued": ["ahead"],
        "Waiting": ["slot_busy", "unresponsive", "model"],  # the brief's field first, so Waiting(True) still builds
        "Progress": ["total", "cache", "processed"],
        "Reasoning": ["text"],
        "Content": ["text"],
        "ToolCallDelta": ["index", "id", "name", "arguments"],
        "ThinkingCapped": ["tokens"],
        "Retrying": [
            "attempt",
            "after_ms",
            "error",
            "resend",
        ],  # the brief's fields first, so Retrying(2, 50, e) still builds
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].ahead = 3  # type: ignore[misc]
    assert Content("a") == Content("a")
    assert Waiting(True) == Waiting(slot_busy=True, unresponsive=False, model=None)


def test_messages_have_the_four_kinds_and_defaults() -> None:
    assistant = AssistantMessage()
    assert (assistant.content, assistant.reasoning_content, list(assistant.tool_calls)) == (None, None, [])
    call = ToolCall(id="c1", name="get_time", arguments='{"city": "Paris"}')
    msgs = [SystemMessage("s"), UserMessage("u"), AssistantMessage("a", "r", [call]), ToolMessage("c1", "12:00")]
    req = ChatRequest(slot=0, messages=msgs)
    assert (req.tools, req.thinking, req.tool_choice) == ((), False, "auto")
    schema = ToolSchema(name="get_time", description="d", parameters={"type": "object"})
    assert ChatRequest(1, msgs, [schema], True, "required").tool_choice == "required"


def test_completion_defaults_and_timings_total() -> None:
    t = Timings(cache_n=10, prompt_n=5, predicted_n=7)
    assert t.total == 22
    c = Completion(id="x", content="hi", reasoning_content=None)
    assert c.finish_reason is FinishReason.STOP
    assert (c.reasoning_tokens, c.thinking_capped, list(c.tool_calls)) == (0, False, [])
    assert [r.value for r in FinishReason] == ["stop", "tool_calls", "length"]
