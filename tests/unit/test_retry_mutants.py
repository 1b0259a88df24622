"""The retry policy's reasons, its refusal of attempt 0, and a zero delay."""

from __future__ import annotations

import pytest

from domain.errors import ConnectError, HttpError, ThinkingOverrun
from domain.retry import RetryDecision, RetryPolicy


class Midpoint:
    """A random source that always draws the middle of the range: no jitter."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def policy(attempts: int = 4, delays_ms: tuple[int, ...] = (2000, 8000, 30_000)) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, delays_ms=delays_ms, jitter=0.25, total_ms=300_000, rng=Midpoint())


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
    decision = policy(attempts=2, delays_ms=(0,)).decide(1, ConnectError("refused"), 10)
    assert decision == RetryDecision(True, attempt=2, after_ms=0)


def schedule(**changes: object) -> dict[str, object]:
    return {"attempts": 4, "delays_ms": (2000,), "jitter": 0.25, "total_ms": 300_000, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"attempts": 0}, "attempts must be at least 1, not 0"),
        ({"delays_ms": ()}, "delays_ms needs at least one delay when attempts > 1"),
        ({"delays_ms": (10, -1)}, "delays_ms must not be negative: (10, -1)"),
        ({"jitter": 1.0}, "jitter must be in [0, 1), not 1.0"),
        ({"total_ms": 0}, "total_ms must be positive, not 0"),
    ],
)
def test_a_schedule_that_cannot_work_is_refused_saying_why(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        RetryPolicy(**schedule(**changes))  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_a_budget_of_one_millisecond_is_taken() -> None:
    assert RetryPolicy(**schedule(total_ms=1)).total_ms == 1  # type: ignore[arg-type]
