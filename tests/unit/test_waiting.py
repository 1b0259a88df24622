"""The wait before the first data event and the liveness limit after it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import LoadTimeout, Stalled, WaitTimeout
from domain.events import Waiting
from domain.waiting import FirstByteWait, Liveness, WaitDecision
from ports.slot_probe import SlotState

BUSY, IDLE, DOWN, HUNG = SlotState.BUSY, SlotState.IDLE, SlotState.UNAVAILABLE, SlotState.UNRESPONSIVE
MS = 0.001
T0 = 1000.0  # an arbitrary clock origin: nothing assumes time starts at zero


def wait(**limits: float) -> FirstByteWait:
    values: dict[str, float] = {
        "poll_s": 0.05,
        "busy_wait_s": 0.2,
        "load_wait_s": 0.15,
        "idle_grace_s": 0.1,
    }
    values.update(limits)
    return FirstByteWait(
        poll_s=values["poll_s"],
        busy_wait_s=values["busy_wait_s"],
        load_wait_s=values["load_wait_s"],
        idle_grace_s=values["idle_grace_s"],
        sent_at=T0,
        slot=0,
    )


def polls(w: FirstByteWait, *steps: tuple[float, SlotState]) -> list[WaitDecision]:
    """Poll at T0 + each offset (in ms) with the given state."""
    return [w.on_poll(T0 + offset * MS, state) for offset, state in steps]


# -- busy -------------------------------------------------------------------------------------


def test_busy_slot_keeps_waiting_with_one_waiting_event_per_poll() -> None:
    out = polls(wait(), (50, BUSY), (100, BUSY), (150, BUSY))
    assert [d.event for d in out] == [Waiting(slot_busy=True)] * 3
    assert all(d.error is None and not d.give_up for d in out)
    assert out[0].slot_busy is True


def test_busy_one_ms_under_the_limit_keeps_waiting() -> None:
    (d,) = polls(wait(), (199, BUSY))
    assert d.error is None


def test_busy_exactly_at_the_limit_is_a_wait_timeout() -> None:
    (d,) = polls(wait(), (200, BUSY))
    assert isinstance(d.error, WaitTimeout)
    assert d.event == Waiting(slot_busy=True)  # the giving-up poll still reports what it saw


def test_busy_one_ms_over_the_limit_is_a_wait_timeout_naming_the_times() -> None:
    (d,) = polls(wait(), (201, BUSY))
    assert isinstance(d.error, WaitTimeout)
    assert str(d.error) == "slot 0 stayed busy for 201 ms (limit 200 ms); no data 201 ms after sending, 1 polls"


def test_time_queued_at_the_gate_counts_against_the_busy_budget_and_is_named() -> None:
    # 130 ms queued behind this client's own request, then busy on the server: one limit for both.
    w = FirstByteWait(
        poll_s=0.05,
        busy_wait_s=0.2,
        load_wait_s=0.15,
        idle_grace_s=0.1,
        sent_at=T0,
        slot=0,
        queued_s=0.13,
    )
    first, second = polls(w, (50, BUSY), (100, BUSY))
    assert first.error is None
    assert isinstance(second.error, WaitTimeout)
    assert str(second.error) == (
        "slot 0 stayed busy for 230 ms (limit 200 ms; 130 ms of it queued in this client);"
        " no data 100 ms after sending, 2 polls"
    )


def test_time_queued_is_no_busy_time_for_an_idle_or_unavailable_slot() -> None:
    w = FirstByteWait(
        poll_s=0.05,
        busy_wait_s=0.2,
        load_wait_s=0.15,
        idle_grace_s=0.1,
        sent_at=T0,
        slot=0,
        queued_s=0.19,
    )
    assert [d.error for d in polls(w, (50, IDLE), (100, DOWN))] == [None, None]
    assert w.busy_s == pytest.approx(0.19)


def test_busy_budget_summed_over_many_polls_is_reached_exactly() -> None:
    w = wait(busy_wait_s=600.0, poll_s=5.0)
    out = [w.on_poll(T0 + 5.0 * i, BUSY) for i in range(1, 121)]
    assert all(d.error is None for d in out[:-1])
    assert isinstance(out[-1].error, WaitTimeout)


# -- unavailable ------------------------------------------------------------------------------


def test_unavailable_keeps_waiting_reporting_slot_not_busy() -> None:
    (d,) = polls(wait(), (50, DOWN))
    assert d == WaitDecision(Waiting(slot_busy=False))


@pytest.mark.parametrize(("offset", "fails"), [(149, False), (150, True), (151, True)])
def test_unavailable_at_the_load_limit_boundary(offset: float, fails: bool) -> None:
    (d,) = polls(wait(), (offset, DOWN))
    assert isinstance(d.error, LoadTimeout) if fails else d.error is None


def test_load_timeout_message_names_the_wait() -> None:
    (d,) = polls(wait(), (150, DOWN))
    assert "unavailable (loading or restarting) for 150 ms (limit 150 ms)" in str(d.error)


# -- unresponsive: charged to the load budget, named apart ------------------------------------


def test_unresponsive_keeps_waiting_and_says_so_in_the_event() -> None:
    (d,) = polls(wait(), (50, HUNG))
    assert d == WaitDecision(Waiting(slot_busy=False, unresponsive=True))
    assert Waiting(False, True) == d.event  # positional, as the brief's field comes first


@pytest.mark.parametrize(("offset", "fails"), [(149, False), (150, True), (151, True)])
def test_unresponsive_at_the_load_limit_boundary(offset: float, fails: bool) -> None:
    (d,) = polls(wait(), (offset, HUNG))
    assert isinstance(d.error, LoadTimeout) if fails else d.error is None
    assert d.event == Waiting(slot_busy=False, unresponsive=True)


def test_an_unresponsive_load_timeout_says_what_was_seen_and_for_how_long() -> None:
    out = polls(wait(), (50, HUNG), (100, HUNG), (160, HUNG))
    assert [d.error for d in out[:2]] == [None, None]
    assert isinstance(out[2].error, LoadTimeout)
    assert str(out[2].error) == (
        "slot 0: the server accepted connections but answered nothing for 160 ms (unresponsive: paused or stuck), "
        "unavailable for 0 ms; limit 150 ms for the two together; no data 160 ms after sending, 3 polls"
    )


def test_unavailable_and_unresponsive_share_the_load_budget_and_are_named_apart() -> None:
    # 100 ms refused or loading, then 50 ms of silence: 150 ms of the 150 ms load budget.
    w = wait()
    out = polls(w, (50, DOWN), (100, DOWN), (150, HUNG))
    assert [d.event for d in out] == [Waiting(False), Waiting(False), Waiting(False, unresponsive=True)]
    assert isinstance(out[2].error, LoadTimeout)
    assert str(out[2].error).startswith(
        "slot 0: the server accepted connections but answered nothing for 50 ms (unresponsive: paused or stuck), "
        "unavailable for 100 ms; limit 150 ms for the two together;"
    )
    assert (w.unavailable_s, w.unresponsive_s) == (pytest.approx(0.1), pytest.approx(0.05))


def test_a_load_timeout_reached_while_unavailable_after_silence_names_both() -> None:
    out = polls(wait(), (100, HUNG), (150, DOWN))
    assert isinstance(out[1].error, LoadTimeout)
    assert "answered nothing for 100 ms (unresponsive: paused or stuck), unavailable for 50 ms" in str(out[1].error)


def test_an_unresponsive_poll_of_no_time_is_still_named() -> None:
    w = wait()
    out = [w.on_poll(T0 + 0.15, DOWN), w.on_poll(T0 + 0.1, HUNG)]  # a clock that went back charges nothing
    assert isinstance(out[0].error, LoadTimeout)
    assert isinstance(out[1].error, LoadTimeout)
    assert "answered nothing for 0 ms (unresponsive: paused or stuck), unavailable for 150 ms" in str(out[1].error)


def test_the_unresponsive_message_of_a_wait_without_a_slot_number() -> None:
    w = FirstByteWait(poll_s=0.1, busy_wait_s=1.0, load_wait_s=1.0, idle_grace_s=1.0, sent_at=0.0)
    assert str(w.on_poll(1.0, HUNG).error) == (
        "the server accepted connections but answered nothing for 1000 ms (unresponsive: paused or stuck), "
        "unavailable for 0 ms; limit 1000 ms for the two together; no data 1000 ms after sending, 1 polls"
    )


def test_silence_eats_into_neither_the_busy_budget_nor_the_idle_grace() -> None:
    out = polls(wait(), (149, HUNG), (348, BUSY), (447, IDLE), (448, BUSY))
    assert [d.error for d in out[:3]] == [None, None, None]
    assert isinstance(out[3].error, WaitTimeout)  # 199 + 1 ms busy; the 99 ms idle is inside its grace


def test_alternating_unresponsive_and_unavailable_ends_at_the_load_limit() -> None:
    w = wait()
    out = [w.on_poll(T0 + 0.01 * i, (HUNG, DOWN)[i % 2]) for i in range(1, 16)]
    assert all(d.error is None for d in out[:-1])
    assert isinstance(out[-1].error, LoadTimeout)  # 80 + 70 ms: neither alone would have reached 150 ms


# -- idle -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("offset", "fails"), [(99, False), (100, True), (101, True)])
def test_idle_and_silent_at_the_grace_boundary(offset: float, fails: bool) -> None:
    (d,) = polls(wait(), (offset, IDLE))
    assert isinstance(d.error, Stalled) if fails else d.error is None
    assert d.event == Waiting(slot_busy=False)


def test_stalls_when_slot_idle_and_silent_past_grace_over_several_polls() -> None:
    out = polls(wait(), (50, IDLE), (100, IDLE))
    assert out[0].error is None
    assert isinstance(out[1].error, Stalled)
    assert "was idle with no answer for 100 ms" in str(out[1].error)


# -- state changes between polls: budgets are per state and never reset -----------------------


def test_busy_then_idle_then_busy_keeps_the_busy_time_already_spent() -> None:
    # 150 ms busy, 50 ms idle, then 50 ms busy: 200 ms busy in all is the limit.
    out = polls(wait(idle_grace_s=1.0), (150, BUSY), (200, IDLE), (250, BUSY))
    assert [d.error for d in out[:2]] == [None, None]
    assert isinstance(out[2].error, WaitTimeout)


def test_idle_glimpses_between_busy_polls_add_up() -> None:
    # Pinned: idle time is cumulative too; two 50 ms idle polls reach a 100 ms grace.
    out = polls(wait(busy_wait_s=10.0), (50, IDLE), (100, BUSY), (150, IDLE))
    assert out[1].error is None
    assert isinstance(out[2].error, Stalled)


def test_a_model_load_does_not_eat_into_the_busy_budget() -> None:
    # 149 ms loading, then queued: 199 ms busy is still inside the busy budget, 200 ms is not.
    out = polls(wait(), (149, DOWN), (348, BUSY), (349, BUSY))
    assert [d.error for d in out[:2]] == [None, None]
    assert isinstance(out[2].error, WaitTimeout)


def test_alternating_unavailable_and_idle_cannot_wait_forever() -> None:
    w = wait()
    error = None
    t = 0.0
    for i in range(1000):
        t += 10
        error = w.on_poll(T0 + t * MS, (DOWN, IDLE)[i % 2]).error
        if error is not None:
            break
    assert isinstance(error, Stalled)  # 100 ms of idle came before 150 ms of unavailable
    assert t <= 150 + 100 + 200 + 10


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.sampled_from([BUSY, IDLE, DOWN, HUNG])), min_size=1, max_size=200))
def test_any_pattern_of_states_ends_within_the_sum_of_the_budgets(steps: list[tuple[int, SlotState]]) -> None:
    w = wait()
    t = 0
    for interval, state in steps:
        t += interval
        decision = w.on_poll(T0 + t * MS, state)
        if decision.error is not None:
            assert t - interval < 200 + 150 + 100  # the poll before it was still inside the budgets
            return
        assert t < 200 + 150 + 100
    assert w.busy_s < 0.2 and w.unavailable_s + w.unresponsive_s < 0.15 and w.idle_s < 0.1


# -- cadence ----------------------------------------------------------------------------------


def test_timeout_counts_down_to_the_next_poll_whatever_else_arrives() -> None:
    w = wait(poll_s=0.05)
    assert w.timeout(T0) == pytest.approx(0.05)
    assert w.timeout(T0 + 0.03) == pytest.approx(0.02)  # a keep-alive at 30 ms does not move the poll
    assert w.timeout(T0 + 0.07) == 0.0
    w.on_poll(T0 + 0.07, BUSY)
    assert w.timeout(T0 + 0.07) == pytest.approx(0.05)


def test_clock_going_backwards_charges_nothing() -> None:
    w = wait()
    w.on_poll(T0 + 0.1, BUSY)
    w.on_poll(T0 + 0.05, BUSY)
    assert w.busy_s == pytest.approx(0.1)


def test_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown slot state"):
        wait().on_poll(T0, "busy")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["poll_s", "busy_wait_s", "load_wait_s", "idle_grace_s"])
def test_limits_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        wait(**{name: 0})


# -- liveness after the first data event ------------------------------------------------------


@pytest.mark.parametrize(("silence_ms", "expired"), [(29_999, False), (30_000, True), (30_001, True)])
def test_liveness_boundary(silence_ms: int, expired: bool) -> None:
    live = Liveness(30.0, T0)
    assert live.expired(T0 + silence_ms * MS) is expired


def test_data_restarts_the_silence_timer() -> None:
    live = Liveness(0.1, T0)
    live.on_data(T0 + 0.09)
    assert not live.expired(T0 + 0.18)
    assert live.timeout(T0 + 0.18) == pytest.approx(0.01)
    assert live.expired(T0 + 0.19)
    assert live.timeout(T0 + 0.19) == 0.0


def test_keep_alive_comments_restart_nothing() -> None:
    # The caller calls on_data only for data events: comments leave the deadline where it was.
    live = Liveness(0.1, T0)
    assert live.timeout(T0 + 0.06) == pytest.approx(0.04)
    assert live.expired(T0 + 0.1)


def test_there_is_no_total_deadline() -> None:
    live = Liveness(0.1, T0)
    for i in range(1, 10_000):
        live.on_data(T0 + i * 0.099)
        assert not live.expired(T0 + i * 0.099 + 0.099)


def test_stalled_error_names_the_silence() -> None:
    live = Liveness(0.1, T0)
    error = live.error(T0 + 0.125)
    assert isinstance(error, Stalled)
    assert str(error) == "no data for 125 ms (liveness limit 100 ms)"


def test_liveness_must_be_positive() -> None:
    with pytest.raises(ValueError, match="liveness_s"):
        Liveness(0, T0)


# -- the brief's section 4, step 2, as the events a caller sees ------------------------------


@pytest.mark.parametrize(
    ("states", "error"),
    [
        ([BUSY, BUSY, BUSY, BUSY], WaitTimeout),  # 4 polls of 50 ms reach the 200 ms busy limit
        ([DOWN, DOWN, DOWN], LoadTimeout),  # 150 ms unavailable
        ([IDLE, IDLE], Stalled),  # 100 ms idle with no byte
        ([DOWN, DOWN, BUSY, BUSY, BUSY, BUSY], WaitTimeout),  # a load, then a queue
        ([BUSY, IDLE, BUSY, IDLE], Stalled),  # idle glimpses add up to the grace
        ([HUNG, HUNG, HUNG], LoadTimeout),  # 150 ms with no answer to the probe
        ([DOWN, HUNG, DOWN], LoadTimeout),  # refused, silent, refused: one load budget
        ([HUNG, HUNG, BUSY, BUSY, BUSY, BUSY], WaitTimeout),  # a pause, then a queue
    ],
)
def test_each_path_emits_one_waiting_per_poll_then_fails(states: list[SlotState], error: type[Exception]) -> None:
    w = wait()
    seen: list[object] = []
    failure = None
    for n, state in enumerate(states, start=1):
        decision = w.on_poll(T0 + n * 0.05, state)
        seen.append(decision.event)
        if decision.error is not None:
            failure = decision.error
            break
    assert seen == [Waiting(slot_busy=s is BUSY, unresponsive=s is HUNG) for s in states]
    assert isinstance(failure, error)


# -- boundaries to the nanosecond, the words of the messages, the liveness read timeout ------------


NANOSECOND = 1e-9


def busy_wait(busy_wait_s: float = 1.0, slot: int | None = 0) -> FirstByteWait:
    limits = {"poll_s": 0.1, "busy_wait_s": busy_wait_s, "load_wait_s": 1.0, "idle_grace_s": 1.0}
    return FirstByteWait(**limits, sent_at=0.0, slot=slot)


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
    assert str(caught.value) == "liveness_s must be a positive number of seconds, not 0"


def test_silence_reaching_the_liveness_limit_to_within_a_nanosecond_has_expired() -> None:
    liveness = Liveness(1.0, now=0.0)
    assert liveness.expired(1.0 - NANOSECOND)
    assert not liveness.expired(0.999)


def test_the_liveness_read_timeout_is_zero_long_after_expiry_never_negative() -> None:
    liveness = Liveness(1.0, now=0.0)
    assert liveness.timeout(0.25) == pytest.approx(0.75)
    assert liveness.timeout(5.0) == 0.0


@pytest.mark.parametrize("name", ["poll_s", "busy_wait_s", "load_wait_s", "idle_grace_s"])
@pytest.mark.parametrize("value", [0, -1, True, "5"])
def test_a_wait_limit_that_is_not_a_positive_number_is_refused_by_name(name: str, value: object) -> None:
    limits: dict[str, object] = {"poll_s": 0.1, "busy_wait_s": 1.0, "load_wait_s": 1.0}
    limits["idle_grace_s"] = 1.0
    limits[name] = value
    with pytest.raises(ValueError) as caught:
        FirstByteWait(**limits, sent_at=0.0)  # type: ignore[arg-type]
    assert str(caught.value) == f"{name} must be a positive number of seconds, not {value!r}"


def test_a_wait_limit_of_under_one_millisecond_is_taken() -> None:
    ms = 0.001
    wait = FirstByteWait(poll_s=ms / 2, busy_wait_s=ms, load_wait_s=ms, idle_grace_s=ms, sent_at=0)
    assert wait.timeout(0.0) == pytest.approx(0.0005)
