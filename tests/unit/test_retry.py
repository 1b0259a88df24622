"""Retry classification and schedule, with a fake random source."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.config import parse_config
from app.container import Container
from domain.errors import (
    Busy,
    ConnectError,
    HttpError,
    InferError,
    LoadTimeout,
    ProtocolError,
    Stalled,
    StreamClosedEarly,
    ThinkingOverrun,
    WaitTimeout,
)
from domain.retry import RetryDecision, RetryPolicy, is_retryable

CONTEXT_400 = (
    '{"error":{"code":400,"message":"request (9000 tokens) exceeds the available context size '
    '(4096 tokens), try increasing it","type":"exceed_context_size_error"}}'
)


class FixedUniform:
    """Always answers the same point of the interval: 0.0 is its low end, 1.0 its high end."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.calls: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.calls.append((a, b))
        return a + (b - a) * self.at


# The brief's schedule, which the config gives by default (pinned in test_config_bounds).
BRIEF: dict[str, Any] = {"attempts": 4, "delays_s": (2.0, 8.0, 30.0), "jitter": 0.25}
BRIEF["total_s"] = 300.0


def policy(at: float = 0.5, **kwargs: object) -> RetryPolicy:
    return RetryPolicy(**{**BRIEF, "rng": FixedUniform(at), **kwargs})


@pytest.mark.parametrize(
    "error",
    [
        ConnectError("no socket"),
        StreamClosedEarly("cut"),
        Stalled("quiet"),
        LoadTimeout("loading"),
        HttpError(503, "x"),
    ],
)
def test_retryable_errors(error: InferError) -> None:
    assert is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [
        WaitTimeout("waited"),
        HttpError(400, CONTEXT_400),
        HttpError(500, "boom"),
        HttpError(502, "bad gateway"),
        ThinkingOverrun("long"),
        ProtocolError("bad"),
        Busy(0, 8),
        InferError("base"),
    ],
)
def test_everything_else_is_final(error: InferError) -> None:
    assert not is_retryable(error)
    assert policy().decide(1, error, 0).retry is False


def test_schedule_without_jitter_is_2_8_30_seconds_then_gives_up() -> None:
    p = policy(0.5)
    err = StreamClosedEarly("cut")
    assert p.decide(1, err, 0) == RetryDecision(True, attempt=2, after_s=2.0)
    assert p.decide(2, err, 3.0) == RetryDecision(True, attempt=3, after_s=8.0)
    assert p.decide(3, err, 12.0) == RetryDecision(True, attempt=4, after_s=30.0)
    last = p.decide(4, err, 50.0)
    assert not last.retry
    assert last.reason == "all 4 attempts made"


@pytest.mark.parametrize(("at", "after_s"), [(0.0, 1.5), (1.0, 2.5), (0.25, 1.75)])
def test_jitter_is_plus_minus_25_percent(at: float, after_s: float) -> None:
    p = policy(at)
    assert p.decide(1, ConnectError("x"), 0).after_s == after_s
    assert p.rng.calls == [(-0.25, 0.25)]  # type: ignore[attr-defined]


def test_seeded_random_source_gives_a_reproducible_schedule_inside_the_jitter() -> None:
    def schedule(seed: int) -> list[float]:
        p = RetryPolicy(**BRIEF, rng=random.Random(seed))
        return [p.decide(n, Stalled("s"), 0).after_s for n in (1, 2, 3)]

    assert schedule(7) == schedule(7)
    for seed in range(50):
        for after, base in zip(schedule(seed), (2.0, 8.0, 30.0), strict=True):
            assert base * 0.75 <= after <= base * 1.25


@pytest.mark.parametrize(
    ("elapsed_s", "retry"),
    [(297.999, True), (298.0, False), (298.001, False)],
)
def test_a_wait_that_would_reach_the_total_budget_is_not_taken(
    elapsed_s: float,
    retry: bool,
) -> None:
    # Pinned: the next attempt must start strictly before total_s (elapsed + wait < total).
    decision = policy(0.5).decide(1, ConnectError("x"), elapsed_s)
    assert decision.retry is retry
    if not retry:
        assert "would reach the 300000 ms retry budget" in decision.reason


def test_budget_is_checked_against_the_jittered_wait() -> None:
    # 2500 ms (the high end of the jitter) would cross; 1500 ms (the low end) would not.
    assert policy(1.0).decide(1, ConnectError("x"), 297.6).retry is False
    assert policy(0.0).decide(1, ConnectError("x"), 297.6).retry is True


def test_single_attempt_never_retries() -> None:
    assert policy(attempts=1, delays_s=()).decide(1, ConnectError("x"), 0).retry is False


def test_last_delay_repeats_when_there_are_more_attempts_than_delays() -> None:
    p = policy(0.5, attempts=5, delays_s=(0.01, 0.02))
    waits = [p.decide(n, ConnectError("x"), 0).after_s for n in (1, 2, 3, 4)]
    assert waits == [0.01, 0.02, 0.02, 0.02]


def test_zero_jitter_waits_exactly_the_delay() -> None:
    p = RetryPolicy(**{**BRIEF, "jitter": 0.0}, rng=random.Random(1))
    assert p.decide(1, ConnectError("x"), 0).after_s == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"total_s": 0},
        {"delays_s": (-1,)},
        {"delays_s": ()},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**{**BRIEF, **kwargs}, rng=random.Random())


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        policy().decide(0, ConnectError("x"), 0)


def test_client_loop_shape_gives_retrying_events_and_stops_at_the_budget() -> None:
    # The loop the client runs, with a fake clock: every attempt takes 40 s and fails.
    p = policy(0.5, total_s=100.0)
    elapsed_s = 0.0
    events: list[tuple[int, float]] = []
    attempt = 1
    while True:
        elapsed_s += 40.0
        decision = p.decide(attempt, Stalled("quiet"), elapsed_s)
        if not decision.retry:
            break
        events.append((decision.attempt, decision.after_s))
        elapsed_s += decision.after_s
        attempt = decision.attempt
    # 40 s, wait 2 s, 40 s (82 s), wait 8 s would end at 90 s < 100 s: taken; 40 s more is 130 s.
    assert events == [(2, 2.0), (3, 8.0)]
    assert attempt == 3


# -- pinned details a careless change would slip past ---------------------------------------------


def test_a_policy_has_no_schedule_of_its_own_and_the_containers_is_the_briefs() -> None:
    # A default lives only in the config: the policy needs every setting, and the one the
    # container builds from a config that sets none is the brief's.
    with pytest.raises(TypeError):
        RetryPolicy()  # type: ignore[call-arg]
    p = Container(config=parse_config({"socket": "/nonexistent/infer.sock"})).client()._llama._retry
    assert (p.attempts, p.delays_s, p.jitter, p.total_s) == (4, (2.0, 8.0, 30.0), 0.25, 300.0)


def test_the_containers_random_sources_are_independent_and_unseeded() -> None:
    # Clients restarted together must not retry in step: two containers' policies draw different
    # waits (three draws over ranges of 1001, 4001 and 15001 values; a tie is out of reach).
    def policy_of_a_new_container() -> RetryPolicy:
        retry: RetryPolicy = (
            Container(config=parse_config({"socket": "/nonexistent/infer.sock"})).client()._llama._retry
        )
        return retry

    def schedule() -> list[float]:
        p = policy_of_a_new_container()
        return [p.decide(n, Stalled("s"), 0).after_s for n in (1, 2, 3)]

    assert policy_of_a_new_container().rng is not policy_of_a_new_container().rng
    assert schedule() != schedule()


def test_a_policy_takes_its_random_source_from_the_caller() -> None:
    with pytest.raises(TypeError):
        RetryPolicy(4, (0.001,), 0.25, 0.01)  # type: ignore[call-arg]


def test_a_policy_is_its_settings_not_its_random_source() -> None:
    assert policy(0.0) == policy(1.0)
    assert policy(0.0, attempts=3) != policy(0.0)
    assert "rng" not in repr(policy())


@pytest.mark.parametrize("status", [408, 429, 500, 501, 502, 504, 507, 599])
def test_of_the_http_statuses_only_503_is_retried(status: int) -> None:
    assert is_retryable(HttpError(503, "x"))
    assert not is_retryable(HttpError(status, "x"))


@pytest.mark.parametrize(("at", "after_s"), [(0.62, 0.011), (0.58, 0.01)])
def test_a_jittered_wait_is_rounded_to_the_nearest_millisecond(at: float, after_s: float) -> None:
    # 10 ms scaled by 1.06 is 10.6 ms, by 1.04 is 10.4 ms: rounded, neither cut nor raised.
    p = policy(at, delays_s=(0.01,))
    assert p.decide(1, Stalled("s"), 0).after_s == after_s


def test_a_zero_delay_is_allowed_and_retries_at_once() -> None:
    p = policy(1.0, delays_s=(0.0,))
    assert p.decide(1, Stalled("s"), 0) == RetryDecision(True, attempt=2, after_s=0.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 2, "delays_s": ()}, {"delays_s": (0.01, -1)}, {"delays_s": (0.01, 0.02, -5)}],
)
def test_more_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**{**BRIEF, **kwargs}, rng=random.Random())


def test_a_refusal_says_why_and_carries_no_attempt_or_wait() -> None:
    p = policy(0.5)
    assert p.decide(1, WaitTimeout("waited"), 0) == RetryDecision(False, reason="WaitTimeout is not retried")
    assert p.decide(2, HttpError(400, CONTEXT_400), 0) == RetryDecision(False, reason="HttpError is not retried")
    assert p.decide(4, Stalled("s"), 0) == RetryDecision(False, reason="all 4 attempts made")
    budget = p.decide(1, Stalled("s"), 298.0)
    assert (budget.retry, budget.attempt, budget.after_s) == (False, 0, 0.0)
    assert budget.reason == "a wait of 2000 ms after 298000 ms would reach the 300000 ms retry budget"


def test_only_a_wait_that_is_considered_draws_from_the_random_source() -> None:
    # A final error and the last attempt draw nothing, so a seeded schedule does not shift with
    # the failures in between.
    p = policy(0.5)
    p.decide(1, ProtocolError("bad"), 0)
    p.decide(4, Stalled("s"), 0)
    assert p.rng.calls == []  # type: ignore[attr-defined]
    p.decide(1, Stalled("s"), 0)
    assert p.rng.calls == [(-0.25, 0.25)]  # type: ignore[attr-defined]


def test_waits_left_are_every_remaining_delay_at_its_largest_jitter_within_the_budget() -> None:
    p = policy()
    # Before attempt 2 every wait is still ahead: (2000 + 8000 + 30000) * 1.25.
    assert p.waits_left_s(2, 0.0) == 50.0
    assert p.waits_left_s(3, 0.0) == 47.5
    assert p.waits_left_s(4, 0.0) == 37.5
    # Never past the budget: 300 s in all, 290 s gone.
    assert p.waits_left_s(2, 290.0) == 10.0
    assert p.waits_left_s(2, 400.0) == 0.0
    assert policy(jitter=0.0).waits_left_s(2, 0.0) == 40.0


# -- the words of a refusal, attempt 0, a zero delay, the edges of a schedule ----------------------


def test_a_final_error_is_named_in_the_reason() -> None:
    decision = policy().decide(1, ThinkingOverrun("on and on"), 0)
    assert decision == RetryDecision(False, reason="ThinkingOverrun is not retried")


def test_a_final_http_status_is_named_by_its_error_class() -> None:
    assert policy().decide(1, HttpError(400, "no"), 0).reason == "HttpError is not retried"


def test_attempt_zero_is_refused_with_the_number_it_got() -> None:
    with pytest.raises(ValueError) as caught:
        policy().decide(0, ConnectError("x"), 0)
    assert str(caught.value) == "attempt numbers start at 1, not 0"


def test_a_zero_delay_retries_at_once() -> None:
    decision = policy(attempts=2, delays_s=(0.0,)).decide(1, ConnectError("refused"), 0.01)
    assert decision == RetryDecision(True, attempt=2, after_s=0.0)


def schedule(**changes: object) -> dict[str, object]:
    return {"attempts": 4, "delays_s": (2.0,), "jitter": 0.25, "total_s": 300.0, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"attempts": 0}, "attempts must be at least 1, not 0"),
        ({"delays_s": ()}, "delays_s needs at least one delay when attempts > 1"),
        ({"delays_s": (0.01, -1)}, "delays_s must not be negative: (0.01, -1)"),
        ({"jitter": 1.0}, "jitter must be in [0, 1), not 1.0"),
        ({"total_s": 0}, "total_s must be positive, not 0"),
    ],
)
def test_a_schedule_that_cannot_work_is_refused_saying_why(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        RetryPolicy(**schedule(**changes), rng=random.Random())  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_a_budget_of_one_millisecond_is_taken() -> None:
    policy = RetryPolicy(**schedule(total_s=0.001), rng=random.Random())  # type: ignore[arg-type]
    assert policy.total_s == 0.001
