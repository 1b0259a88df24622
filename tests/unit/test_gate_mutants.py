"""The slot gate's status readers on a slot nobody has asked for yet, and a cancel while queued."""

from __future__ import annotations

import threading

from domain.cancel import CancelToken
from domain.errors import Cancelled
from domain.gate import SlotGate

JOIN_S = 5.0


def test_a_slot_never_held_has_no_waiters_and_no_holder() -> None:
    gate = SlotGate(queue_per_slot=2)
    assert gate.waiting(5) == 0
    assert not gate.held(5)


def test_a_slot_held_and_released_has_no_waiters_left() -> None:
    gate = SlotGate(queue_per_slot=2)
    with gate.hold(1, on_event=lambda event: None):
        assert gate.held(1)
        assert gate.waiting(1) == 0
    assert not gate.held(1)
    assert gate.waiting(1) == 0


class ObservedToken(CancelToken):
    """A cancel token that signals when the gate first looks at it: the gate looks under its
    lock right before it sleeps, so a cancel after that signal finds the waiter asleep."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_at = threading.Event()

    @property
    def cancelled(self) -> bool:
        self.looked_at.set()
        return super().cancelled


def test_a_waiter_asleep_in_the_queue_is_woken_by_a_cancel() -> None:
    gate = SlotGate(queue_per_slot=1)
    holder = gate.enter(0)
    waiter = gate.enter(0)
    token = ObservedToken()
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            gate.wait(waiter, token)
        except Cancelled as exc:
            raised.append(exc)
        finally:
            gate.leave(waiter)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        assert token.looked_at.wait(JOIN_S)
        token.cancel()
        thread.join(JOIN_S)
        # Only the cancel can have woken it: the holder still holds the slot.
        assert not thread.is_alive()
        assert gate.held(0)
    finally:
        gate.leave(holder)  # wakes a waiter the cancel failed to wake
        thread.join(JOIN_S)
    assert [type(e) for e in raised] == [Cancelled]
    assert gate.waiting(0) == 0


def test_a_ticket_that_holds_the_slot_at_once_has_no_one_ahead() -> None:
    gate = SlotGate(queue_per_slot=1)
    holder = gate.enter(0)
    waiter = gate.enter(0)
    assert (holder.ahead, waiter.ahead) == (0, 1)
    gate.leave(waiter)
    gate.leave(holder)
