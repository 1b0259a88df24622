"""The slot gate's wake-ups, and the asyncio queue on them.

`watch(ticket, wake)` calls `wake()` on every change of the ticket's slot (and at once for a change
since the last look); `poll(ticket)` says, without blocking, whether the ticket got the slot (0),
moved up (its new place) or not (None). `AsyncSlotQueue` waits on them in one queue with the
blocking waiters of `SlotQueue`.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from adapters.system import AsyncSystemClock, SystemClock
from app.slot_queue import AsyncSlotQueue, SlotQueue
from domain.cancel import CancelToken
from domain.errors import Cancelled
from domain.gate import SlotGate

pytestmark = pytest.mark.timeout(10)


def test_poll_says_nothing_changed_until_the_ticket_moves_up() -> None:
    gate = SlotGate(queue_per_slot=4)
    holder = gate.enter(0)
    second = gate.enter(0)
    third = gate.enter(0)

    assert (second.ahead, third.ahead) == (1, 2)
    assert gate.poll(third) is None
    gate.leave(second)  # a waiter ahead leaves the queue
    assert gate.poll(third) == 1
    assert gate.poll(third) is None, "a place is reported once"
    gate.leave(holder)
    assert gate.poll(third) == 0
    assert gate.held(0)


def test_every_change_of_the_slot_wakes_each_watcher_the_new_holder_included() -> None:
    gate = SlotGate(queue_per_slot=4)
    holder = gate.enter(0)
    second, third = gate.enter(0), gate.enter(0)
    woken: list[str] = []
    gate.watch(second, lambda: woken.append("second"))
    gate.watch(third, lambda: woken.append("third"))

    gate.leave(holder)  # second gets the slot, third moves up
    assert sorted(woken) == ["second", "third"]
    woken.clear()
    gate.leave(second)  # second leaves: its watch ends with it
    assert woken == ["third"]


def test_a_wake_that_raises_does_not_break_the_release() -> None:
    gate = SlotGate(queue_per_slot=1)
    holder = gate.enter(0)
    waiter = gate.enter(0)

    def broken() -> None:
        raise RuntimeError("the loop is closed")

    gate.watch(waiter, broken)
    gate.leave(holder)

    assert gate.poll(waiter) == 0


def test_a_watch_that_starts_after_an_unseen_change_wakes_at_once() -> None:
    # A waiter looks (`poll`), then starts watching: a release between the two is not lost.
    gate = SlotGate(queue_per_slot=2)
    holder = gate.enter(0)
    waiter, behind = gate.enter(0), gate.enter(0)
    assert gate.poll(behind) is None
    gate.leave(holder)
    woken: list[str] = []

    gate.watch(waiter, lambda: woken.append("waiter"))
    gate.watch(behind, lambda: woken.append("behind"))

    assert woken == ["waiter", "behind"]
    assert (gate.poll(waiter), gate.poll(behind)) == (0, 1)
    woken.clear()
    gate.watch(behind, lambda: woken.append("behind"))
    assert woken == [], "a change already seen wakes nobody"
    gate.leave(waiter)
    gate.leave(behind)


def test_watch_none_stops_the_wake_ups() -> None:
    gate = SlotGate(queue_per_slot=1)
    holder = gate.enter(0)
    waiter = gate.enter(0)
    woken: list[int] = []
    gate.watch(waiter, lambda: woken.append(1))
    gate.watch(waiter, None)

    gate.leave(holder)

    assert woken == []


# -- the asyncio gate ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_async_waiter_gets_the_slot_a_thread_releases() -> None:
    gate = SlotGate(queue_per_slot=2)
    holder = gate.enter(0)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    ticket = aio.enter(0)
    assert ticket.ahead == 1

    threading.Timer(0.05, gate.leave, (holder,)).start()
    ahead = await asyncio.wait_for(aio.wait(ticket, CancelToken(), aio.clock.now() + 60.0), 2.0)

    assert ahead == 0
    assert gate.held(0)
    aio.leave(ticket)
    assert not gate.held(0)


@pytest.mark.asyncio
async def test_a_thread_waiting_behind_an_async_holder_gets_the_slot_it_releases() -> None:
    gate = SlotGate(queue_per_slot=2)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    mine = aio.enter(0)
    got: list[int] = []
    blocked = gate.enter(0)
    queue = SlotQueue(gate, SystemClock())
    deadline = queue.clock.now() + 60.0
    token = CancelToken()
    thread = threading.Thread(target=lambda: got.append(queue.wait(blocked, token, deadline)))
    thread.start()

    await asyncio.sleep(0.02)
    assert got == []
    aio.leave(mine)
    thread.join(2.0)

    assert got == [0]


@pytest.mark.asyncio
async def test_a_cancelled_async_waiter_leaves_the_queue_and_stops_watching() -> None:
    gate = SlotGate(queue_per_slot=2)
    holder = gate.enter(0)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    ticket = aio.enter(0)
    task = asyncio.create_task(aio.wait(ticket, CancelToken(), aio.clock.now() + 60.0))
    await asyncio.sleep(0.01)

    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        aio.leave(ticket)

    assert task.cancelled()
    assert gate.waiting(0) == 0
    assert ticket.wake is None
    gate.leave(holder)
    assert not gate.held(0)


@pytest.mark.asyncio
async def test_async_waiters_move_up_in_order() -> None:
    gate = SlotGate(queue_per_slot=3)
    holder = gate.enter(0)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    first, second = aio.enter(0), aio.enter(0)
    waits = [
        asyncio.create_task(aio.wait(first, CancelToken(), aio.clock.now() + 60.0)),
        asyncio.create_task(aio.wait(second, CancelToken(), aio.clock.now() + 60.0)),
    ]
    await asyncio.sleep(0.01)

    gate.leave(holder)
    places = await asyncio.wait_for(asyncio.gather(*waits), 2.0)

    assert places == [0, 1]


@pytest.mark.asyncio
async def test_a_cancel_from_another_thread_ends_an_async_wait_at_once() -> None:
    gate = SlotGate(queue_per_slot=2)
    holder = gate.enter(0)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    ticket = aio.enter(0)
    token = CancelToken()
    threading.Timer(0.05, token.cancel).start()
    started = time.monotonic()

    with pytest.raises(Cancelled):
        await asyncio.wait_for(aio.wait(ticket, token, aio.clock.now() + 60.0), 2.0)

    assert time.monotonic() - started < 0.05 + 0.1
    assert ticket.wake is None, "the wait stopped watching the slot"
    aio.leave(ticket)
    assert gate.waiting(0) == 0
    gate.leave(holder)


@pytest.mark.asyncio
async def test_a_slot_handed_over_as_the_deadline_passes_is_taken_not_timed_out() -> None:
    gate = SlotGate(queue_per_slot=2)
    holder = gate.enter(0)
    aio = AsyncSlotQueue(gate, AsyncSystemClock())
    ticket = aio.enter(0)
    # The holder leaves on the loop's next turn, just before the deadline (already due) fires.
    asyncio.get_running_loop().call_soon(gate.leave, holder)

    ahead = await aio.wait(ticket, CancelToken(), aio.clock.now())

    assert ahead == 0, "the ticket holds the slot it was handed"
    assert gate.held(0)
    aio.leave(ticket)
    assert not gate.held(0)
