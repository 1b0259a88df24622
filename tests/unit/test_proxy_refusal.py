"""A connection closed right after its request was written, before any response byte, is what
inferproxy does to one over its limits: `ProxyRefused`, retried after the proxy's refill time
(`retry_after_s`) instead of on the outage schedule. A request the server may have started (a
response byte came, or time passed after the request) is never taken for a refusal."""

from __future__ import annotations

import random

import pytest

from adapters.fake_server import End, FakeClock, Piece, Raw, ScriptedTransport
from adapters.uds_http._sync.exchange import REFUSED_WITHIN_S
from domain.errors import ConnectError, ProxyRefused, StreamClosedEarly
from domain.retry import Attempts, RetryDecision, RetryPolicy

CHAT = "/v1/chat/completions"


def policy(jitter: float = 0.0, **changes: object) -> RetryPolicy:
    settings: dict[str, object] = {
        "attempts": 4,
        "delays_s": (2.0, 8.0, 30.0),
        "jitter": jitter,
        "total_s": 300.0,
        "rng": random.Random(7),
    }
    return RetryPolicy(**{**settings, **changes})  # type: ignore[arg-type]


def exchange_of(raw: Raw) -> tuple[FakeClock, object]:
    clock = FakeClock()
    transport = ScriptedTransport(clock, {("POST", CHAT): [raw]}, header_bytes=16384)
    return clock, transport.open("POST", CHAT, b"{}", timeout=1.0)


# -- the schedule -----------------------------------------------------------------------------


def test_a_refusal_is_retried_after_its_own_wait_not_the_schedules_delay() -> None:
    refused = ProxyRefused("closed at once", retry_after_s=0.5)

    assert policy().decide(1, refused, 0) == RetryDecision(True, attempt=2, after_s=0.5)
    assert policy().decide(1, StreamClosedEarly("cut"), 0).after_s == 2.0


def test_a_refusals_wait_is_jittered_upwards_only() -> None:
    refused = ProxyRefused("x", 0.5)
    policies = [policy(jitter=0.25, rng=random.Random(seed)) for seed in range(50)]
    waits = {p.decide(1, refused, 0).after_s for p in policies}

    assert min(waits) >= 0.5 and max(waits) <= 0.625
    assert len(waits) > 10, "jittered, so that clients refused together do not come back in step"


def test_a_refusal_counts_as_an_attempt_under_the_same_total() -> None:
    attempts = Attempts(policy(attempts=3, total_s=20.0), started=0.0)
    refused, cut = ProxyRefused("x", 0.5), StreamClosedEarly("cut")

    assert attempts.next(refused, 0.0).retry
    assert attempts.next(cut, 0.5).retry
    last = attempts.next(refused, 9.0)
    assert not last.retry and last.reason == "all 3 attempts made"
    late = Attempts(policy(total_s=2.0), started=0.0).next(refused, 1.6)
    assert not late.retry, "a wait that would end past total_ms is not taken"


def test_a_second_refusal_in_a_row_waits_the_schedules_delay_as_an_outage_does() -> None:
    # A proxy whose upstream is down closes a connection as it closes one it refuses: a refusal
    # right after the bucket's refill is taken for an outage, so a restart is still waited out.
    attempts = Attempts(policy(), started=0.0)
    refused = ProxyRefused("x", 0.5)

    waits = [attempts.next(refused, now).after_s for now in (0.0, 0.5, 8.5)]

    assert waits == [0.5, 8.0, 30.0]  # the refill, then the schedule's waits for the rest


def test_a_refusal_is_a_stream_closed_early_so_nothing_that_catches_that_changes() -> None:
    refused = ProxyRefused("x", 0.5)

    assert isinstance(refused, StreamClosedEarly) and refused.retried
    assert refused.retry_after_s == 0.5
    assert StreamClosedEarly("cut").retry_after_s is None
    assert ConnectError("x").retry_after_s is None


# -- what the exchange takes for a refusal ----------------------------------------------------


@pytest.mark.parametrize("end", [End.CLOSE, End.RESET])
def test_a_close_at_once_before_any_response_byte_is_a_refusal(end: End) -> None:
    _, exchange = exchange_of(Raw([], end))

    with pytest.raises(ProxyRefused, match="before any response byte") as raised:
        exchange.head(10.0)  # type: ignore[attr-defined]

    assert raised.value.retry_after_s == 0.5  # the proxy's default rate, 2 a second


@pytest.mark.parametrize("end", [End.CLOSE, End.RESET])
def test_a_close_after_time_passed_is_no_refusal(end: End) -> None:
    # The server had the request that long: it may have started on it.
    _, exchange = exchange_of(Raw([Piece(REFUSED_WITHIN_S + 0.05, b"")], end))

    with pytest.raises(StreamClosedEarly, match="before any response byte") as raised:
        exchange.head(10.0)  # type: ignore[attr-defined]

    assert not isinstance(raised.value, ProxyRefused)


def test_a_close_after_a_response_byte_is_no_refusal() -> None:
    _, exchange = exchange_of(Raw([Piece(0, b"H")], End.CLOSE))

    with pytest.raises(StreamClosedEarly, match="inside the response head") as raised:
        exchange.head(10.0)  # type: ignore[attr-defined]

    assert not isinstance(raised.value, ProxyRefused)
