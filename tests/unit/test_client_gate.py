"""Each retry goes back through the slot gate: the slot is held for one attempt, never across the
`Retrying` event or the wait after it. On the in-memory fakes, in one thread and without sleeping:
the other caller runs inside the first one's `Retrying` callback or inside its wait (a clock
whose `sleep` calls back). With `queue_per_slot = 0` a slot still held shows as `Busy` at once
instead of a caller queued behind its own thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from adapters.fake_server import FakeClock, FakeSlotProbe, ScriptedTransport, error_reply, sse_reply
from app.client import Client
from app.config import parse_config
from client_support import CHAT, EXPECT, overridden
from client_support import chunk as stream_chunk
from domain.completion import Completion, FinishReason, Timings
from domain.errors import Busy
from domain.events import ChatEvent, Content, Retrying
from domain.gate import SlotGate
from domain.messages import ChatRequest, UserMessage
from ports import SlotState

CID = "chatcmpl-7rSxDkVw0a2LqHcZ9mTnBf4JgE1uYoPi"
REQ = ChatRequest(slot=1, messages=(UserMessage("hello"),))
OTHER = ChatRequest(slot=1, messages=(UserMessage("someone else"),))
chunk = partial(stream_chunk, cid=CID, cache_n=0, prompt_n=9)
ANSWER = [chunk({"content": "Hi"}, n=1), chunk(finish="stop", n=1)]
COMPLETION = Completion(CID, "Hi", None, (), FinishReason.STOP, Timings(0, 9, 1), 0, False)
LOADING = error_reply(503, "Loading model", "unavailable_error")


class ZeroJitter:
    def uniform(self, a: float, b: float) -> float:
        return 0.0


class HookedClock(FakeClock):
    """A `FakeClock` whose `sleep` (the client sleeps only for a retry wait) first calls `during`."""

    def __init__(self) -> None:
        super().__init__()
        self.during: Callable[[float], None] = lambda seconds: None

    def sleep(self, seconds: float, wake: object = None) -> None:
        self.during(seconds)
        super().sleep(seconds)


@dataclass
class Rig:
    client: Client
    gate: SlotGate
    clock: HookedClock
    transport: ScriptedTransport
    events: list[ChatEvent] = field(default_factory=list)


@pytest.fixture
def rig_for() -> Iterator[Callable[..., Rig]]:

    def build(*replies: Any, queue_per_slot: int = 8) -> Rig:
        config = parse_config(
            {
                "socket": "/fake/llama.sock",
                "expect": EXPECT,
                "limits": {"queue_per_slot": queue_per_slot},
            }
        )
        clock = HookedClock()
        transport = ScriptedTransport(clock, {CHAT: list(replies)})
        gate = SlotGate(queue_per_slot)
        container = make(
            config,
            clock=clock,
            transport=transport,
            probe=FakeSlotProbe({REQ.slot: SlotState.IDLE}),
            rng=ZeroJitter(),
            gate=gate,
        )
        return Rig(container.client(), gate, clock, transport)

    with overridden() as make:
        yield build


def test_the_slot_is_held_during_an_attempt_and_free_at_retrying_and_through_the_wait(
    rig_for: Callable[..., Rig],
) -> None:
    rig = rig_for(sse_reply(ANSWER[:1], done=False), sse_reply(ANSWER))
    held_at: list[tuple[str, bool]] = []

    def on_event(event: ChatEvent) -> None:
        rig.events.append(event)
        held_at.append((type(event).__name__, rig.gate.held(REQ.slot)))

    rig.clock.during = lambda seconds: held_at.append((f"sleep {seconds}", rig.gate.held(REQ.slot)))

    assert rig.client.chat_with_retry(REQ, on_event) == COMPLETION

    # The first attempt's Content proves the probe sees a held slot; then Retrying, the 2 s wait.
    assert held_at == [
        ("Content", True),
        ("Retrying", False),
        ("sleep 2.0", False),
        ("Content", True),
    ]
    assert not rig.gate.held(REQ.slot) and rig.gate.waiting(REQ.slot) == 0


@pytest.mark.parametrize("when", ["at Retrying", "during the wait"])
def test_another_caller_gets_the_slot_while_a_retry_waits(rig_for: Callable[..., Rig], when: str) -> None:
    # Attempt 1 of REQ gets a 503; OTHER runs whole in REQ's retry wait; then REQ's attempt 2.
    rig = rig_for(LOADING, sse_reply(ANSWER), sse_reply(ANSWER), queue_per_slot=0)
    other: list[Completion | Busy] = []
    other_events: list[ChatEvent] = []

    def run_other() -> None:
        try:
            other.append(rig.client.chat(OTHER, other_events.append))
        except Busy as exc:  # the slot was still held by the caller that is only waiting
            other.append(exc)

    def on_event(event: ChatEvent) -> None:
        rig.events.append(event)
        if isinstance(event, Retrying) and when == "at Retrying":
            run_other()

    if when == "during the wait":
        rig.clock.during = lambda seconds: run_other()

    assert rig.client.chat_with_retry(REQ, on_event) == COMPLETION

    assert other == [COMPLETION]
    assert other_events == [Content("Hi")]
    assert [r.json()["messages"][0]["content"] for r in rig.transport.requests] == [
        "hello",
        "someone else",
        "hello",
    ]
    assert rig.transport.requests[0].body == rig.transport.requests[2].body
    assert [type(e) for e in rig.events] == [Retrying, Content]
