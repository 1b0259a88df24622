"""The attempt machine (`domain.attempt`) walked through every move of its table and every
decision, without a socket: what a call does next after each thing that can happen to it."""

from __future__ import annotations

import random

import pytest

from domain.attempt import TRANSITIONS, AttemptMachine, AttemptStateError, Input, Phase
from domain.errors import ConnectError, HttpError, LoadTimeout, ProtocolError, Stalled, StreamClosedEarly
from domain.retry import Attempts, RetryPolicy

LIVE = [p for p in Phase if p not in (Phase.DONE, Phase.FAILED)]


class Fixed(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 0.0


def machine(*, resend: bool = True, attempts: int = 4, total_s: float = 60.0) -> AttemptMachine:
    schedule = {"delays_s": (0.1, 0.2, 0.4), "jitter": 0.0, "total_s": total_s}
    policy = RetryPolicy(attempts=attempts, **schedule, rng=Fixed())  # type: ignore[arg-type]
    return AttemptMachine(Attempts(policy, 0.0), resend=resend)


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
