"""The attempt machine (`domain.attempt`) walked through every move of its table and every
decision, without a socket: what a call does next after each thing that can happen to it."""

from __future__ import annotations

import random

import pytest

from client_support import STREAM_LIMITS
from domain.attempt import (
    ACTIONS,
    TRANSITIONS,
    Action,
    AttemptMachine,
    AttemptStateError,
    Input,
    Phase,
)
from domain.errors import (
    ConnectError,
    HttpError,
    LoadTimeout,
    ModelNotLoaded,
    ProtocolError,
    Stalled,
    StreamClosedEarly,
    WaitTimeout,
)
from domain.limits import ClientLimits
from domain.retry import Attempts, RetryPolicy
from ports.slot_probe import SlotState

LIVE = [p for p in Phase if p not in (Phase.DONE, Phase.FAILED)]
# Polls each 100 ms; the slot may stay busy 1 s, loading 0.5 s, idle 0.3 s.
LIMITS = ClientLimits(
    poll_s=0.1,
    busy_wait_s=1.0,
    load_wait_s=0.5,
    idle_grace_s=0.3,
    body_bytes=1 << 16,
    error_body_bytes=4096,
    stream=STREAM_LIMITS,
)


class Fixed(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 0.0


def machine(*, resend: bool = True, attempts: int = 4, total_s: float = 60.0) -> AttemptMachine:
    policy = RetryPolicy(attempts=attempts, delays_s=(0.1, 0.2, 0.4), jitter=0.0, total_s=total_s, rng=Fixed())
    return AttemptMachine(Attempts(policy, 0.0), LIMITS, 0, resend=resend)


def at(phase: Phase, **options: object) -> AttemptMachine:
    m = machine(**options)  # type: ignore[arg-type]
    m.phase = phase
    return m


@pytest.mark.parametrize(("start", "what"), sorted(TRANSITIONS, key=lambda k: (k[0].value, k[1].value)))
def test_every_move_of_the_table_lands_where_the_table_says(start: Phase, what: Input) -> None:
    m = at(start)

    assert m.happened(what) is TRANSITIONS[start, what]
    assert m.phase is TRANSITIONS[start, what]


@pytest.mark.parametrize("start", list(Phase))
def test_every_input_the_table_lacks_is_the_drivers_bug_and_moves_nothing(start: Phase) -> None:
    for what in Input:
        if (start, what) in TRANSITIONS:
            continue
        m = at(start)
        with pytest.raises(AttemptStateError, match=f"{what.value} cannot happen while {start.value}"):
            m.happened(what)
        assert m.phase is start


def test_done_and_failed_are_final() -> None:
    assert not [key for key in TRANSITIONS if key[0] in (Phase.DONE, Phase.FAILED)]


def test_a_call_that_goes_well_walks_queued_to_done() -> None:
    m = machine()
    walk = [Input.SLOT_FREE, Input.PREPARED, Input.SENT, Input.POLLED, Input.HEAD, Input.COMPLETED]

    assert [m.happened(what) for what in walk] == [
        Phase.PREPARING,
        Phase.SENDING,
        Phase.AWAITING_HEAD,
        Phase.AWAITING_HEAD,
        Phase.STREAMING,
        Phase.DONE,
    ]


def test_a_cut_after_the_head_is_re_attached_from_the_bytes_consumed_and_mended() -> None:
    m = at(Phase.STREAMING)
    cut = StreamClosedEarly("closed after chunk 4")

    taken = m.cut_at(cut, now=1.0, offset=2048)

    assert (m.phase, taken.then, taken.after_s) == (Phase.BACKING_OFF, Input.REATTACH, 0.1)
    assert (taken.event.attempt, taken.event.resend) == (2, False)
    assert m.cut is cut
    m.happened(taken.then)
    m.happened(Input.PICKED_UP)
    assert (m.phase, m.cut) == (Phase.STREAMING, None)


def test_a_re_attach_that_cannot_connect_is_still_the_cut_and_the_first_break_is_kept() -> None:
    m = at(Phase.STREAMING)
    first = Stalled("no data for 30000 ms")
    m.happened(m.cut_at(first, 1.0, 100).then)

    taken = m.cut_at(ConnectError("refused"), 2.0, 100)

    assert isinstance(taken.error, StreamClosedEarly) and "could not be picked up again" in str(taken.error)
    assert m.cut is first, "the break a re-attach mends, not the failed re-attach after it"
    assert taken.event.attempt == 3


def test_a_cut_past_the_last_attempt_is_raised_and_the_call_failed() -> None:
    m = at(Phase.STREAMING, attempts=1)
    cut = StreamClosedEarly("closed")

    with pytest.raises(StreamClosedEarly) as caught:
        m.cut_at(cut, 1.0, 10)

    assert caught.value is cut and m.phase is Phase.FAILED


def test_a_cut_whose_wait_would_pass_the_retry_total_is_raised() -> None:
    m = at(Phase.STREAMING, total_s=1.0)

    with pytest.raises(Stalled):
        m.cut_at(Stalled("silence"), now=0.95, offset=0)
    assert m.phase is Phase.FAILED


def test_a_refused_re_attach_re_sends_at_once_with_the_cut_it_would_have_mended() -> None:
    m = at(Phase.STREAMING)
    cut = StreamClosedEarly("closed after chunk 4")
    m.happened(m.cut_at(cut, 1.0, 2048).then)

    event = m.refused()

    assert (m.phase, event.after_ms, event.resend, event.attempt) == (Phase.SENDING, 0, True, 2)
    assert event.error == f"StreamClosedEarly: {cut}" and m.cut is None


def test_a_refused_re_attach_of_a_call_that_may_not_re_send_raises_the_named_cut() -> None:
    m = at(Phase.STREAMING, resend=False)
    m.happened(m.cut_at(StreamClosedEarly("closed"), 1.0, 0).then)
    named = StreamClosedEarly("closed; the router unloaded the model mid-answer")
    m.name_cut(named)

    with pytest.raises(StreamClosedEarly) as caught:
        m.refused()

    assert caught.value is named and m.phase is Phase.FAILED


def test_a_refusal_with_no_cut_is_the_drivers_bug() -> None:
    with pytest.raises(AttemptStateError):
        at(Phase.REATTACHING).refused()


@pytest.mark.parametrize("phase", LIVE)
def test_a_failure_worth_a_re_send_goes_back_through_the_gate_from_any_live_phase(phase: Phase) -> None:
    m = at(phase)

    taken = m.failed(HttpError(503, "Loading model"), now=1.0)

    assert (m.phase, taken.then, taken.event.resend) == (Phase.BACKING_OFF, Input.RESEND, True)
    m.happened(taken.then)
    assert m.phase is Phase.QUEUED


@pytest.mark.parametrize(
    "error", [HttpError(400, "exceeds the available context size"), ProtocolError("bad"), LoadTimeout("x")]
)
def test_a_call_that_may_not_re_send_raises_every_failure(error: Exception) -> None:
    m = at(Phase.AWAITING_HEAD, resend=False)

    with pytest.raises(type(error)):
        m.failed(error, 1.0)  # type: ignore[arg-type]
    assert m.phase is Phase.FAILED


def test_a_failure_the_policy_does_not_retry_is_raised() -> None:
    m = at(Phase.AWAITING_HEAD)

    with pytest.raises(ProtocolError):
        m.failed(ProtocolError("bad json"), 1.0)
    assert m.phase is Phase.FAILED


def test_re_attaches_and_re_sends_spend_one_schedule() -> None:
    m = at(Phase.STREAMING, attempts=3)
    m.happened(m.cut_at(StreamClosedEarly("a"), 1.0, 0).then)  # attempt 2: a re-attach
    m.happened(Input.PICKED_UP)

    taken = m.failed(HttpError(503, "Loading model"), 2.0)  # attempt 3: a re-send

    assert taken.event.attempt == 3
    m.happened(taken.then)
    with pytest.raises(HttpError):
        m.failed(HttpError(503, "Loading model"), 3.0)  # no fourth


# -- the actions the driver does ------------------------------------------------------------------


def test_every_phase_has_one_action_and_a_live_phase_is_never_done() -> None:
    assert set(ACTIONS) == set(Phase)
    assert [p for p in LIVE if ACTIONS[p] in (Action.DONE, Action.STOP)] == []


def test_a_call_that_goes_well_asks_for_each_action_in_turn() -> None:
    m = machine()
    actions = [m.action]
    m.slot_free(0.0, now=0.0)
    actions.append(m.action)
    m.happened(Input.PREPARED)
    actions.append(m.action)
    m.sent(0.01)
    actions.append(m.action)
    m.happened(Input.HEAD)
    actions.append(m.action)
    m.happened(Input.COMPLETED)
    actions.append(m.action)

    assert actions == [
        Action.ENTER,
        Action.PREPARE,
        Action.SEND,
        Action.POLL,
        Action.READ,
        Action.DONE,
    ]


def test_a_cut_is_slept_on_then_re_attached_as_decided() -> None:
    m = at(Phase.STREAMING)
    m.cut_at(StreamClosedEarly("closed"), 1.0, 0)
    assert m.action is Action.SLEEP and m.pending is not None

    assert m.slept() is Phase.REATTACHING
    assert (m.action, m.pending) == (Action.REATTACH, None)


def test_a_sleep_with_no_retry_decided_is_the_drivers_bug() -> None:
    with pytest.raises(AttemptStateError, match="no retry to make"):
        at(Phase.BACKING_OFF).slept()


# -- the budgets ---------------------------------------------------------------------------------


def test_the_time_queued_at_the_gate_is_charged_to_busy_wait_ms() -> None:
    m = machine()
    m.slot_free(0.7, now=10.0)
    m.happened(Input.PREPARED)
    wait = m.sent(10.0)

    assert wait.busy_s == pytest.approx(0.7)
    m.polled(10.2, SlotState.BUSY)
    decision = m.polled(10.3, SlotState.BUSY)  # 0.7 queued + 0.3 busy: busy_wait_ms reached
    assert isinstance(decision.error, WaitTimeout)
    assert "700 ms of it queued in this client" in str(decision.error)


def test_the_preparation_is_charged_to_the_first_poll_so_a_slow_restore_resets_no_budget() -> None:
    m = machine()
    m.slot_free(0.0, now=10.0)
    m.happened(Input.PREPARED)  # the prediction and a restore took 0.25 s: the slot held, no answer
    wait = m.sent(10.25)

    assert wait.timeout(10.25) == 0.0  # the first poll is overdue: the wait ran from the slot taken
    decision = m.polled(10.3, SlotState.IDLE)  # 0.3 s idle: the grace, counted from the slot taken
    assert isinstance(decision.error, Stalled)
    assert m.phase is Phase.AWAITING_HEAD


def test_a_re_send_within_the_attempt_finds_the_slot_held_and_starts_a_fresh_wait() -> None:
    m = machine()
    m.slot_free(0.7, now=10.0)
    m.happened(Input.PREPARED)
    m.sent(10.5)
    m.happened(Input.HEAD)
    m.happened(m.cut_at(StreamClosedEarly("closed"), 11.0, 0).then)
    m.refused()

    wait = m.sent(11.2)

    assert (wait.busy_s, wait.timeout(11.2)) == (0.0, pytest.approx(0.1))


def test_a_load_is_charged_and_carried_into_the_chats_own_wait() -> None:
    m = machine()
    assert m.failed(ModelNotLoaded(400, "model is not loaded"), 0.0) is None
    assert (m.phase, m.action) == (Phase.LOADING, Action.LOAD)
    m.load_wait(0.0)
    m.polled(0.1, SlotState.LOADING)
    m.polled(0.2, SlotState.BEHIND)
    m.loaded()
    assert (m.phase, m.charged.loaded) == (Phase.QUEUED, True)

    m.slot_free(0.0, now=0.25)
    m.happened(Input.PREPARED)
    wait = m.sent(0.25)

    assert (wait.loading_s, wait.behind_s) == (pytest.approx(0.1), pytest.approx(0.1))
    decision = m.polled(0.55, SlotState.LOADING)  # 0.1 + 0.3 loading, no more: under 500 ms
    assert decision.error is None
    assert isinstance(m.polled(0.65, SlotState.LOADING).error, LoadTimeout)


def test_a_load_that_timed_out_is_re_sent_with_what_it_charged() -> None:
    m = machine()
    m.failed(ModelNotLoaded(400, "model is not loaded"), 0.0)
    m.load_wait(0.0)
    decision = m.polled(0.5, SlotState.LOADING)
    assert isinstance(decision.error, LoadTimeout)

    taken = m.failed(decision.error, 0.5)

    assert taken is not None and taken.then is Input.RESEND
    assert m.charged.load_s == pytest.approx(0.5), "no budget resets another"


def test_a_model_evicted_again_after_its_load_is_not_waited_for_twice() -> None:
    m = machine()
    m.failed(ModelNotLoaded(400, "model is not loaded"), 0.0)
    m.load_wait(0.0)
    m.loaded()
    m.slot_free(0.0, now=0.1)

    with pytest.raises(ModelNotLoaded):
        m.failed(ModelNotLoaded(400, "model is not loaded"), 0.1)
    assert m.phase is Phase.FAILED


def test_a_load_wait_outside_loading_is_the_drivers_bug() -> None:
    with pytest.raises(AttemptStateError, match="no load to wait for"):
        at(Phase.SENDING).load_wait(0.0)


def test_a_poll_outside_a_head_or_load_wait_is_the_drivers_bug() -> None:
    with pytest.raises(AttemptStateError, match="polled cannot happen while streaming"):
        at(Phase.STREAMING).polled(1.0, SlotState.IDLE)


def test_a_restore_may_wait_what_the_load_budget_has_left_after_a_load_and_preparing() -> None:
    m = machine()
    m.failed(ModelNotLoaded(400, "model is not loaded"), 0.0)
    m.load_wait(0.0)
    m.polled(0.1, SlotState.LOADING)  # 0.1 of the 0.5 s load budget spent loading
    m.loaded()
    m.slot_free(0.0, now=0.2)

    assert m.preparing_left_s(0.25) == pytest.approx(0.35)  # 0.5 - 0.1 loading - 0.05 preparing
    assert m.preparing_left_s(1.0) == 0.0


def test_a_restore_outside_the_preparation_is_the_drivers_bug() -> None:
    with pytest.raises(AttemptStateError, match="nothing prepared while sending"):
        at(Phase.SENDING).preparing_left_s(0.0)
