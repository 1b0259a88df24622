"""An exact thinking cap with no race: with `thinking_budget_tokens` sent, the server ends the
thinking block at exactly the cap, and the client emits `ThinkingCapped` when the reasoning gives
way to the answer there, with no control call; the `reasoning_end` call stays the fallback for a
server that ignored the budget, asked for only past the cap plus the end tag's own tokens."""

from __future__ import annotations

import json

import orjson

from adapters.fake_server import chunk
from client_support import stream_limits
from domain.chat_stream import ChatStream, PostReasoningEnd
from domain.events import Content, Reasoning, ThinkingCapped
from domain.messages import ChatRequest, UserMessage
from domain.request import RequestSettings, build_chat_body
from domain.thinking import END_TAG_TOKENS, Action, ThinkingCap

CAP = 10
LIMITS = stream_limits(thinking_cap=CAP, thinking_overrun=4)


def sse(*chunks: dict[str, object]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


def reasoning_to(n: int) -> list[dict[str, object]]:
    return [chunk({"reasoning_content": f"r{i}"}, n=i) for i in range(1, n + 1)]


def steps(budget_sent: bool, *chunks: dict[str, object]) -> list[object]:
    stream = ChatStream(LIMITS, 100, 0.0, budget_sent=budget_sent)
    return list(stream.feed(sse(*chunks), 0.0))


def test_reasoning_ended_by_the_budget_at_the_cap_is_capped_before_the_answer_and_posts_nothing() -> None:
    out = steps(True, *reasoning_to(CAP), chunk({"content": "answer"}, n=CAP + 7))
    assert not any(isinstance(s, PostReasoningEnd) for s in out)
    capped = out.index(ThinkingCapped(tokens=CAP))
    assert isinstance(out[capped - 1], Reasoning) and out[capped + 1] == Content("answer")


def test_the_budget_ended_thinking_is_marked_capped_in_the_completion() -> None:
    stream = ChatStream(LIMITS, 100, 0.0, budget_sent=True)
    out = stream.feed(sse(*reasoning_to(CAP), chunk({"content": "a"}, n=CAP + 7), chunk(finish="stop", n=CAP + 7)), 0.0)
    completion = out[-1]
    assert getattr(completion, "thinking_capped", None) is True


def test_reasoning_that_ends_before_the_cap_is_not_capped() -> None:
    out = steps(True, *reasoning_to(CAP - 1), chunk({"content": "answer"}, n=CAP + 5))
    assert not any(isinstance(s, ThinkingCapped | PostReasoningEnd) for s in out)


def test_the_end_tags_tokens_counted_while_the_block_is_open_ask_for_no_control_call() -> None:
    # predicted_n runs past the cap by the end tag's tokens before the answer starts.
    out = steps(True, *reasoning_to(CAP), chunk({"reasoning_content": " "}, n=CAP + END_TAG_TOKENS - 1))
    assert not any(isinstance(s, PostReasoningEnd) for s in out)


def test_a_server_that_ignored_the_budget_gets_the_control_call_past_the_end_tag_allowance() -> None:
    out = steps(True, *reasoning_to(CAP + END_TAG_TOKENS))
    assert [s for s in out if isinstance(s, PostReasoningEnd)] == [
        PostReasoningEnd("chatcmpl-e52Fn0Tt6dIR9JxXjCGDYjcBiSKXIs7Y")
    ]


def test_without_the_budget_the_control_call_comes_at_the_cap_as_before() -> None:
    out = steps(False, *reasoning_to(CAP))
    assert sum(isinstance(s, PostReasoningEnd) for s in out) == 1
    assert not any(isinstance(s, ThinkingCapped) for s in out)


def test_the_cap_decides_once_whichever_way_it_is_reached() -> None:
    cap = ThinkingCap(CAP, 4, budget_sent=True)
    assert cap.observe(CAP, True) is Action.NONE
    assert cap.ended(CAP) is True
    assert cap.ended(CAP) is False, "once"
    assert cap.capped and cap.capped_at == CAP
    assert ThinkingCap(CAP, 4).ended(CAP) is False, "no budget sent: the control call caps"


SETTINGS = RequestSettings(model="m", max_tokens=64, thinking_budget=CAP)


def test_a_thinking_request_carries_the_budget_and_a_plain_one_does_not() -> None:
    thinking = json.loads(
        build_chat_body(ChatRequest(slot=0, messages=(UserMessage("hi"),), thinking=True), SETTINGS, total_slots=1)
    )
    plain = json.loads(build_chat_body(ChatRequest(slot=0, messages=(UserMessage("hi"),)), SETTINGS, total_slots=1))
    assert thinking["thinking_budget_tokens"] == CAP
    assert "thinking_budget_tokens" not in plain
    unset = RequestSettings(model="m", max_tokens=64)
    body = json.loads(
        build_chat_body(ChatRequest(slot=0, messages=(UserMessage("hi"),), thinking=True), unset, total_slots=1)
    )
    assert "thinking_budget_tokens" not in body


def test_reasoning_that_comes_back_after_the_budget_ended_a_block_is_capped_by_the_control_call() -> None:
    # The budget ended the first block at the cap; a second one starts: it is not an overrun of
    # a control call never made, but reasoning past the cap, capped at the fallback point.
    second = [chunk({"reasoning_content": f"s{i}"}, n=CAP + 1 + i) for i in range(1, END_TAG_TOKENS + 2)]
    out = steps(True, *reasoning_to(CAP), chunk({"content": "a"}, n=CAP + 1), *second)
    assert out.count(ThinkingCapped(tokens=CAP)) == 1
    posts = [s for s in out if isinstance(s, PostReasoningEnd)]
    assert len(posts) == 1, out
    assert not any(isinstance(s, Exception) for s in out)


def test_an_answer_that_ends_in_the_read_that_reaches_the_fallback_point_posts_no_control_call() -> None:
    # The final chunk is in hand: nothing the server says after it can change the answer.
    trigger = CAP + END_TAG_TOKENS
    stream = ChatStream(LIMITS, 100, 0.0, budget_sent=True)
    out = stream.feed(sse(*reasoning_to(trigger), chunk(finish="length", n=trigger)), 0.0)
    assert not any(isinstance(s, PostReasoningEnd) for s in out)
    assert out[-2:-1] == [ThinkingCapped(tokens=trigger)]
    assert getattr(out[-1], "thinking_capped", None) is True


def test_thinking_capped_names_the_count_the_control_call_was_decided_at() -> None:
    trigger = CAP + END_TAG_TOKENS
    stream = ChatStream(LIMITS, 100, 0.0, budget_sent=True)
    out = stream.feed(sse(*reasoning_to(trigger + 3)), 0.0)  # one read: the call is decided at the trigger
    assert len([s for s in out if isinstance(s, PostReasoningEnd)]) == 1
    assert stream.control_answered(None) == ThinkingCapped(tokens=trigger)
