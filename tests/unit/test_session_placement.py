"""Where a session's request goes (`domain.sessions`): decided from values, no I/O."""

from __future__ import annotations

import re

import pytest

from domain.errors import RequestError
from domain.messages import ChatRequest, UserMessage
from domain.sessions import SESSION_KEY_CHARS, Placement, SlotView, Why, arrival, place, session_of

HI = (UserMessage("hi"),)


def view(slot: int, holder: str | None = None, *, busy: bool = False, used: int = 0) -> SlotView:
    return SlotView(slot, holder, busy, used)


def test_a_session_goes_back_to_the_slot_that_holds_its_prompt_even_when_it_is_busy() -> None:
    slots = [view(0, None), view(1, "a", busy=True, used=5)]
    assert place("a", slots) == Placement(1, Why.HOLDER, None)


def test_a_new_session_takes_a_free_slot_before_evicting_anyone() -> None:
    slots = [view(0, "a", used=1), view(1, None, used=9), view(2, "b", used=2)]
    assert place("c", slots) == Placement(1, Why.FREE, None)


def test_a_free_slot_that_a_call_holds_or_waits_for_is_not_free() -> None:
    slots = [view(0, None, busy=True), view(1, "a", used=3), view(2, "b", used=2)]
    assert place("c", slots) == Placement(2, Why.IDLE, "b")


def test_without_a_free_slot_the_least_recently_used_idle_one_is_taken_and_evicted() -> None:
    slots = [view(0, "a", used=4), view(1, "b", used=2, busy=True), view(2, "c", used=3)]
    assert place("d", slots) == Placement(2, Why.IDLE, "c")


def test_with_every_slot_busy_the_least_recently_used_is_queued_for() -> None:
    slots = [view(0, "a", busy=True, used=4), view(1, "b", busy=True, used=2)]
    assert place("c", slots) == Placement(1, Why.BUSY, "b")


def test_ties_go_to_the_lowest_slot() -> None:
    assert place("a", [view(0), view(1)]).slot == 0


def test_a_slot_is_saved_from_only_when_another_sessions_known_prompt_is_there() -> None:
    assert not arrival("a", "a", known=True, checkpointed=True).moved
    moved = arrival("a", "b", known=True, checkpointed=True)
    assert (moved.save, moved.restore, moved.moved) == ("b", True, True)
    # a request that never completed left something unknown there: nothing worth a checkpoint
    assert arrival("a", "b", known=False, checkpointed=False).save is None
    assert arrival("a", None, known=True, checkpointed=False).save is None


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (ChatRequest(messages=HI), "a request needs slot= or session="),
        (ChatRequest(0, HI, session="a"), "not both"),
        (ChatRequest(messages=HI, session=""), "session must not be empty"),
        (ChatRequest(messages=HI, session=7), "must be a str, not int"),  # type: ignore[arg-type]
        (
            ChatRequest(messages=HI, session="x" * (SESSION_KEY_CHARS + 1)),
            "characters long, over 256",
        ),
        (ChatRequest(messages=HI, session="a\nb"), "control character (U+000A) at 1"),
        (ChatRequest(messages=HI, session="a\x85"), "control character (U+0085) at 1"),
    ],
)
def test_a_request_names_exactly_one_of_slot_and_session_and_a_key_that_can_name_one(
    req: ChatRequest, message: str
) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        session_of(req)


def test_a_slot_request_works_as_before_positional_or_by_name() -> None:
    assert session_of(ChatRequest(0, HI)) is None
    assert session_of(ChatRequest(slot=1, messages=HI)) is None
    key = "daemon-7 ünïcode ok"
    assert session_of(ChatRequest(session=key, messages=HI)) == key
    assert session_of(ChatRequest(session="x" * SESSION_KEY_CHARS, messages=HI)) is not None
