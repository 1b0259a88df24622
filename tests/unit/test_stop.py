"""`stop`: a generation's `DELETE` takes its wait in all: what the connect and the write took
comes off the wait for the answer's head, and a close's budget is what is left of one wait for
every stop it makes."""

from __future__ import annotations

import pytest

from adapters.fake_server import FakeClock
from app._sync.side_calls import stop
from app.calls import CLOSING, StopBudget
from app.config import parse_config
from app.container import client_limits
from ports.transport import TIMED_OUT

LIMITS = client_limits(parse_config({"socket": "/s", "limits": {"liveness_ms": 5000}}))  # a 250 ms stop


class Exchange:
    def __init__(self, clock: FakeClock, answer_after: float | None) -> None:
        self.clock = clock
        self.answer_after = answer_after
        self.head_waits: list[float] = []
        self.closed = False

    def head(self, timeout: float) -> object:
        self.head_waits.append(timeout)
        if self.answer_after is None or self.answer_after > timeout:
            self.clock.advance(timeout)
            return TIMED_OUT
        self.clock.advance(self.answer_after)
        return type("Head", (), {"status": 200})()

    def close(self) -> None:
        self.closed = True


class Transport:
    """Its `open` takes `connect_s` of the clock's time."""

    def __init__(self, clock: FakeClock, connect_s: float, answer_after: float | None = None) -> None:
        self.clock = clock
        self.connect_s = connect_s
        self.opened: list[tuple[str, str, float]] = []
        self.exchange = Exchange(clock, answer_after)

    def open(self, method: str, path: str, body: bytes | None, *, timeout: float) -> Exchange:
        self.opened.append((method, path, timeout))
        self.clock.advance(self.connect_s)
        return self.exchange


def test_the_time_to_connect_and_write_comes_off_the_wait_for_the_head() -> None:
    clock = FakeClock()
    transport = Transport(clock, connect_s=0.2)

    stop(transport, clock, "/v1/stream?conv_id=x", LIMITS)  # type: ignore[arg-type]

    assert transport.opened == [("DELETE", "/v1/stream?conv_id=x", 0.25)]
    assert transport.exchange.head_waits == [pytest.approx(0.05)]
    assert clock.now() == pytest.approx(0.25), "250 ms in all"
    assert transport.exchange.closed


def test_the_stops_of_one_close_share_one_wait_and_a_stop_past_it_waits_for_nothing() -> None:
    clock = FakeClock()
    budget = StopBudget()
    token = CLOSING.set(budget)
    try:
        first, second = Transport(clock, connect_s=0.0), Transport(clock, connect_s=0.0)
        stop(first, clock, "/v1/stream?conv_id=a", LIMITS)  # type: ignore[arg-type]
        stop(second, clock, "/v1/stream?conv_id=b", LIMITS)  # type: ignore[arg-type]
    finally:
        CLOSING.reset(token)

    assert first.exchange.head_waits == [pytest.approx(0.25)]
    assert second.opened == [("DELETE", "/v1/stream?conv_id=b", 0.0)], "still written"
    assert second.exchange.head_waits == [0.0]
    assert clock.now() == pytest.approx(0.25)
    assert budget.left_s == pytest.approx(0.0)


def test_a_stop_answered_at_once_leaves_the_rest_of_the_wait_to_the_next() -> None:
    clock = FakeClock()
    budget = StopBudget()
    token = CLOSING.set(budget)
    try:
        stop(Transport(clock, connect_s=0.01, answer_after=0.02), clock, "/v1/stream?conv_id=a", LIMITS)  # type: ignore[arg-type]
    finally:
        CLOSING.reset(token)

    assert budget.left_s == pytest.approx(0.22)
