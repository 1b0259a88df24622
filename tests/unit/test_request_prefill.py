"""`ChatRequest.prefill`: the answer's opening, sent as a last assistant message the server goes on
from, byte for byte what a trailing `AssistantMessage` renders, without that message in the
caller's history; refused where llama-server would refuse it; predicted by the prompt cache as the
request with that message."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.completion import Completion, Timings
from domain.errors import RequestError
from domain.messages import (
    AssistantMessage,
    ChatMessage,
    ChatRequest,
    SystemMessage,
    ToolMessage,
    ToolSchema,
    UserMessage,
)
from domain.prompt_cache import Rendered, SlotTurn, predict
from domain.request import RequestSettings, build_chat_body

SETTINGS = RequestSettings(model="m", max_tokens=64, temperature=0.0, seed=42, thinking_budget=24)
TOOL = ToolSchema("get_time", "The time in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})
OPENING = '<tool_call>\n{"name": "get_time", "arguments": {"city": "'
ASK = ChatRequest(slot=0, messages=[UserMessage("What time is it in Paris?")], tools=[TOOL], tool_choice="required")


def body(req: ChatRequest) -> bytes:
    return build_chat_body(req, SETTINGS, total_slots=1)


def ending_in(opening: str, req: ChatRequest = ASK) -> ChatRequest:
    """`req` as built before `prefill`: the opening as a last assistant message."""
    return replace(req, messages=[*req.messages, AssistantMessage(content=opening)], prefill=None)


def test_the_prefill_renders_the_very_bytes_of_a_trailing_assistant_message() -> None:
    sent = body(replace(ASK, prefill=OPENING))
    assert sent == body(ending_in(OPENING))
    assert sent.count(b'{"role":"assistant","content":"<tool_call>\\n{\\"name\\"') == 1


def test_without_a_prefill_the_body_is_what_it_was() -> None:
    assert body(replace(ASK, prefill=None)) == body(ASK)
    assert b'"role":"assistant"' not in body(ASK)


histories = st.lists(
    st.one_of(
        st.builds(SystemMessage, st.text(max_size=10)),
        st.builds(UserMessage, st.text(max_size=10)),
        st.builds(ToolMessage, st.text(max_size=5), st.text(max_size=10)),
        st.builds(AssistantMessage, st.text(max_size=10)),
    ),
    min_size=1,
    max_size=5,
).filter(lambda messages: not isinstance(messages[-1], AssistantMessage))


@settings(max_examples=200, deadline=None)
@given(histories, st.text(min_size=1, max_size=30), st.sampled_from(["auto", "required", "none"]))
def test_any_prefill_after_any_history_renders_as_the_trailing_assistant_message(
    history: list[ChatMessage], opening: str, choice: str
) -> None:
    req = ChatRequest(slot=0, messages=history, tools=[TOOL], tool_choice=choice)  # type: ignore[arg-type]
    assert body(replace(req, prefill=opening)) == body(ending_in(opening, req))


def test_the_prefill_leaves_the_callers_messages_as_they_were() -> None:
    history = [UserMessage("What time is it in Paris?")]
    body(ChatRequest(slot=0, messages=history, tools=[TOOL], prefill=OPENING))
    assert history == [UserMessage("What time is it in Paris?")]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"prefill": 5}, "prefill must be a string, not int"),
        ({"prefill": b"<tool_call>"}, "prefill must be a string, not bytes"),
        ({"prefill": ""}, "prefill is empty: give the answer's opening, or None for no prefill"),
        ({"prefill": "<tool_call>\ud800"}, "prefill holds text that is not valid Unicode"),
        (
            {"prefill": OPENING, "thinking": True},
            "prefill cannot be combined with thinking: llama-server refuses an assistant prefill then",
        ),
        (
            {"prefill": OPENING, "messages": [UserMessage("time?"), AssistantMessage("It is")]},
            "prefill cannot follow an assistant message: llama-server refuses two assistant messages at the end",
        ),
    ],
)
def test_a_prefill_the_server_would_refuse_or_misread_is_a_request_error(change: dict[str, object], said: str) -> None:
    with pytest.raises(RequestError) as caught:
        body(replace(ASK, **change))  # type: ignore[arg-type]
    assert str(caught.value).startswith(said)


def test_a_prefill_after_a_tool_result_is_sent() -> None:
    history: list[ChatMessage] = [
        UserMessage("time?"),
        AssistantMessage("Let me look."),
        ToolMessage("call_1", "12:00"),
    ]
    req = ChatRequest(slot=0, messages=history, tools=[TOOL])
    assert body(replace(req, prefill="It is ")) == body(ending_in("It is ", req))


# -- the prompt cache -------------------------------------------------------------------------------

PROMPT = list(range(1000, 1100))
BEFORE = Rendered.of("<user>time?</user><assistant>" + OPENING, PROMPT)


def test_the_prediction_for_a_prefilled_request_is_the_one_for_its_trailing_message() -> None:
    answer = Completion("c", None, None, timings=Timings(0, 100, 20))
    prefilled = replace(ASK, prefill=OPENING)
    by_hand = ending_in(OPENING)
    assert SlotTurn.of(prefilled, b"{}", BEFORE, answer) == SlotTurn.of(by_hand, b"{}", BEFORE, answer)
    previous = SlotTurn.of(ASK, b"{}", Rendered.of("<user>time?</user><assistant>", PROMPT[:90]), answer)
    now = Rendered.of("x", [*PROMPT[:60], 7, 7])
    assert predict(previous, BEFORE, prefilled, now, 119, 4) == predict(previous, BEFORE, by_hand, now, 119, 4)
    assert predict(previous, BEFORE, prefilled, now, 119, 4).message == 1
