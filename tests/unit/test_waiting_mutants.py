"""The wait policy's boundaries to the nanosecond, its messages, and the liveness read timeout."""

from __future__ import annotations

import pytest

from domain.errors import WaitTimeout
from domain.waiting import FirstByteWait, Liveness
from ports.slot_probe import SlotState

NANOSECOND = 1e-9


def busy_wait(busy_wait_ms: float = 1000, slot: int | None = 0) -> FirstByteWait:
    return FirstByteWait(
        poll_ms=100, busy_wait_ms=busy_wait_ms, load_wait_ms=1000, idle_grace_ms=1000, sent_at=0.0, slot=slot
    )


def test_a_budget_reached_to_within_a_nanosecond_is_reached() -> None:
    decision = busy_wait().on_poll(1.0 - NANOSECOND, SlotState.BUSY)
    assert isinstance(decision.error, WaitTimeout)


def test_half_a_millisecond_short_of_the_budget_is_not_reached() -> None:
    assert busy_wait().on_poll(0.9995, SlotState.BUSY).error is None


def test_the_message_of_a_wait_without_a_slot_number_says_the_slot() -> None:
    decision = busy_wait(slot=None).on_poll(1.0, SlotState.BUSY)
    assert str(decision.error) == (
        "the slot stayed busy for 1000 ms (limit 1000 ms); no data 1000 ms after sending, 1 polls"
    )


def test_the_message_counts_every_poll() -> None:
    wait = busy_wait(slot=3)
    decisions = [wait.on_poll(t, SlotState.BUSY) for t in (0.25, 0.5, 0.75, 1.0)]
    assert [d.error is None for d in decisions] == [True, True, True, False]
    assert str(decisions[-1].error) == (
        "slot 3 stayed busy for 1000 ms (limit 1000 ms); no data 1000 ms after sending, 4 polls"
    )


def test_a_liveness_limit_that_is_not_positive_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as caught:
        Liveness(0, now=0.0)
    assert str(caught.value) == "liveness_ms must be a positive number of milliseconds, not 0"


def test_silence_reaching_the_liveness_limit_to_within_a_nanosecond_has_expired() -> None:
    liveness = Liveness(1000, now=0.0)
    assert liveness.expired(1.0 - NANOSECOND)
    assert not liveness.expired(0.999)


def test_the_liveness_read_timeout_is_zero_long_after_expiry_never_negative() -> None:
    liveness = Liveness(1000, now=0.0)
    assert liveness.timeout(0.25) == pytest.approx(0.75)
    assert liveness.timeout(5.0) == 0.0


@pytest.mark.parametrize("name", ["poll_ms", "busy_wait_ms", "load_wait_ms", "idle_grace_ms"])
@pytest.mark.parametrize("value", [0, -1, True, "5"])
def test_a_wait_limit_that_is_not_a_positive_number_is_refused_by_name(name: str, value: object) -> None:
    limits: dict[str, object] = {"poll_ms": 100, "busy_wait_ms": 1000, "load_wait_ms": 1000, "idle_grace_ms": 1000}
    limits[name] = value
    with pytest.raises(ValueError) as caught:
        FirstByteWait(**limits, sent_at=0.0)  # type: ignore[arg-type]
    assert str(caught.value) == f"{name} must be a positive number of milliseconds, not {value!r}"


def test_a_wait_limit_of_under_one_millisecond_is_taken() -> None:
    wait = FirstByteWait(poll_ms=0.5, busy_wait_ms=1, load_wait_ms=1, idle_grace_ms=1, sent_at=0.0)
    assert wait.timeout(0.0) == pytest.approx(0.0005)
