"""The wait at the slot gate runs on the clock port: a fake clock decides it at once, the system
clock lets a release or a cancel end it at once.

On a `FakeClock` a queued wait either sees a change that came before it without time passing,
or jumps the clock to its deadline and times out, so `busy_wait_ms` at the gate costs no real
time. Every test runs over both queues (`SlotQueue`, `AsyncSlotQueue`) or both clients.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from adapters.fake_server import (
    AsyncFakeClock,
    AsyncFakeSlotProbe,
    AsyncScriptedTransport,
    FakeClock,
    FakeSlotProbe,
    ScriptedTransport,
    sse_reply,
)
from adapters.system import AsyncSystemClock, SystemClock
from app.config import parse_config
from app.slot_queue import AsyncSlotQueue, SlotQueue
from client_support import CHAT, EXPECT, Kind, overridden
from domain.cancel import CancelToken
from domain.errors import Cancelled, WaitTimeout
from domain.events import ChatEvent, Queued
from domain.gate import SlotGate, Ticket
from ports import SlotState
from ports.transport import TIMED_OUT, TimedOut
from scripted_client import ANSWER, REQ

pytestmark = pytest.mark.timeout(10)

FLAVOURS = ("sync", "async")
# Far above what any of these waits may take in real time, far below the limits they wait for.
REAL_S = 2.0

Wait = Callable[[Ticket, CancelToken, float], "int | TimedOut"]


def waiter(flavour: str, gate: SlotGate, clock: FakeClock | None) -> Wait:
    """`wait(ticket, cancel, seconds)` through the queue of `flavour`, on `clock` (the system
    clock when None), its deadline `seconds` from the clock's now."""
    if flavour == "sync":
        queue = SlotQueue(gate, clock or SystemClock())
        return lambda ticket, cancel, s: queue.wait(ticket, cancel, queue.clock.now() + s)
    aio = AsyncSlotQueue(gate, AsyncFakeClock(clock) if clock else AsyncSystemClock())

    def run(ticket: Ticket, cancel: CancelToken, seconds: float) -> int | TimedOut:
        return asyncio.run(aio.wait(ticket, cancel, aio.clock.now() + seconds))

    return run


# -- on the fake clock -----------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_fake_clock_wait_jumps_to_its_deadline_and_times_out(flavour: str) -> None:
    gate, clock = SlotGate(queue_per_slot=1), FakeClock(start=5.0)
    holder, ticket = gate.enter(0), gate.enter(0)
    started = time.monotonic()

    assert waiter(flavour, gate, clock)(ticket, CancelToken(), 600.0) is TIMED_OUT

    assert clock.now() == 605.0
    assert time.monotonic() - started < REAL_S
    assert (ticket.ahead, gate.waiting(0)) == (1, 1), "the caller leaves, not the wait"
    gate.leave(ticket)
    gate.leave(holder)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_release_before_the_wait_is_seen_with_no_fake_time(flavour: str) -> None:
    gate, clock = SlotGate(queue_per_slot=2), FakeClock()
    holder, first, second = gate.enter(0), gate.enter(0), gate.enter(0)
    gate.leave(holder)
    wait = waiter(flavour, gate, clock)

    assert wait(second, CancelToken(), 600.0) == 1
    assert wait(first, CancelToken(), 600.0) == 0

    assert clock.now() == 0.0
    gate.leave(first)
    assert wait(second, CancelToken(), 600.0) == 0
    assert clock.now() == 0.0
    gate.leave(second)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_cancelled_fake_clock_wait_raises_with_no_fake_time(flavour: str) -> None:
    gate, clock = SlotGate(queue_per_slot=1), FakeClock()
    holder, ticket = gate.enter(0), gate.enter(0)
    token = CancelToken()
    token.cancel()

    with pytest.raises(Cancelled):
        waiter(flavour, gate, clock)(ticket, token, 600.0)

    assert clock.now() == 0.0
    assert ticket.wake is None, "the wait stopped watching the slot"
    gate.leave(ticket)
    gate.leave(holder)


def test_a_queued_call_gets_wait_timeout_after_busy_wait_ms_of_fake_time(client_kind: Kind) -> None:
    # The brief's busy_wait_ms, 10 minutes, passes on the fake clock alone.
    config = parse_config({"socket": "/fake/llama.sock", "expect": EXPECT})
    assert config.limits.busy_wait_ms == 600_000
    gate, clock = SlotGate(config.limits.queue_per_slot), FakeClock()
    states = {REQ.slot: SlotState.IDLE}
    fakes: dict[str, Any]
    if client_kind.is_async:
        transport: ScriptedTransport = AsyncScriptedTransport(clock, {CHAT: sse_reply(ANSWER)})
        fakes = {"async_clock": AsyncFakeClock(clock), "async_transport": transport}
        fakes["async_probe"] = AsyncFakeSlotProbe(states)
    else:
        transport = ScriptedTransport(clock, {CHAT: sse_reply(ANSWER)})
        fakes = {"clock": clock, "transport": transport, "probe": FakeSlotProbe(states)}
    holder = gate.enter(REQ.slot)  # another caller of this client holds the slot throughout
    events: list[ChatEvent] = []
    started = time.monotonic()

    with overridden() as make:
        client = client_kind.client_of(make(config, gate=gate, **fakes))
        own = r"slot 1 busy with this client's own requests .*\(limit 600000 ms\)"
        with pytest.raises(WaitTimeout, match=own):
            client.chat(REQ, events.append)

    assert clock.now() == pytest.approx(600.0)
    assert time.monotonic() - started < REAL_S
    assert events == [Queued(1)]
    assert transport.requests == []
    assert gate.held(REQ.slot) and gate.waiting(REQ.slot) == 0
    gate.leave(holder)


# -- on the system clock ---------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_release_from_another_thread_wakes_a_system_clock_wait(flavour: str) -> None:
    gate = SlotGate(queue_per_slot=1)
    holder, ticket = gate.enter(0), gate.enter(0)
    release = threading.Timer(0.05, gate.leave, (holder,))
    started = time.monotonic()
    release.start()
    try:
        assert waiter(flavour, gate, None)(ticket, CancelToken(), 60.0) == 0
    finally:
        release.join(REAL_S)

    assert time.monotonic() - started < REAL_S
    assert gate.held(0) and gate.waiting(0) == 0
    gate.leave(ticket)
    assert not gate.held(0)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_cancel_from_another_thread_wakes_a_system_clock_wait(flavour: str) -> None:
    gate = SlotGate(queue_per_slot=1)
    holder, ticket = gate.enter(0), gate.enter(0)
    token = CancelToken()
    cancel = threading.Timer(0.05, token.cancel)
    started = time.monotonic()
    cancel.start()
    try:
        with pytest.raises(Cancelled):
            waiter(flavour, gate, None)(ticket, token, 60.0)
    finally:
        cancel.join(REAL_S)

    assert time.monotonic() - started < REAL_S
    assert ticket.wake is None, "the wait stopped watching the slot"
    gate.leave(ticket)
    assert gate.held(0) and gate.waiting(0) == 0
    gate.leave(holder)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_wait_on_the_system_clock_times_out_at_its_deadline(flavour: str) -> None:
    gate = SlotGate(queue_per_slot=1)
    holder, ticket = gate.enter(0), gate.enter(0)
    started = time.monotonic()

    assert waiter(flavour, gate, None)(ticket, CancelToken(), 0.1) is TIMED_OUT

    assert 0.1 <= time.monotonic() - started < REAL_S
    gate.leave(ticket)
    gate.leave(holder)
