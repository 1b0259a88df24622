"""The slot gate's status readers on a slot nobody has asked for yet."""

from __future__ import annotations

from domain.gate import SlotGate


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
