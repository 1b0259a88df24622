"""fetch and error_body: what an error answer keeps, and when they stop reading (the blocking
flavour, and the asyncio one where it differs in what it is given)."""

from __future__ import annotations

import pytest

from adapters.fake_server.memory import AsyncFakeClock, FakeClock
from app._async.fetch import fetch as fetch_async
from app._sync.fetch import error_body, fetch
from domain.bodies import FetchLimits
from domain.errors import HttpError, Stalled
from ports.transport import TIMED_OUT, ResponseHead, TimedOut


class PiecesExchange:
    """An exchange that answers `head` and then hands out `pieces` one per read, recording the
    timeout of every read; each read costs `read_cost` seconds of the fake clock."""

    def __init__(
        self,
        clock: FakeClock,
        head: ResponseHead | TimedOut,
        pieces: list[bytes | TimedOut],
        read_cost: float = 0.0,
    ) -> None:
        self.clock = clock
        self._head = head
        self.pieces = list(pieces)
        self.read_cost = read_cost
        self.reads: list[float] = []
        self.closed = False

    def head(self, timeout: float) -> ResponseHead | TimedOut:
        return self._head

    def read(self, timeout: float) -> bytes | TimedOut:
        self.reads.append(timeout)
        self.clock.advance(self.read_cost)
        return self.pieces.pop(0) if self.pieces else b""

    def read_all(self, limit: int, timeout: float) -> bytes:
        return b"".join(p for p in self.pieces if isinstance(p, bytes))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class OneExchangeTransport:
    def __init__(self, exchange: PiecesExchange) -> None:
        self.exchange = exchange

    def open(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float, cancel: object = None
    ) -> PiecesExchange:
        return self.exchange


def test_an_error_body_in_several_pieces_is_kept_whole() -> None:
    clock = FakeClock()
    exchange = PiecesExchange(clock, ResponseHead(400), [b'{"error": ', b'"bad"', b"}"])
    assert error_body(exchange, clock, deadline=5.0, limit=100) == b'{"error": "bad"}'


def test_error_body_stops_reading_once_it_has_the_limit() -> None:
    clock = FakeClock()
    exchange = PiecesExchange(clock, ResponseHead(400), [b"abcd", b"efgh"])
    assert error_body(exchange, clock, deadline=5.0, limit=4) == b"abcd"
    assert len(exchange.reads) == 1
    assert exchange.pieces == [b"efgh"]


def test_error_body_at_its_deadline_reads_nothing_and_keeps_nothing() -> None:
    clock = FakeClock(start=5.0)
    exchange = PiecesExchange(clock, ResponseHead(400), [b"late"])
    assert error_body(exchange, clock, deadline=5.0, limit=100) == b""
    assert exchange.reads == []


def test_error_body_keeps_what_came_before_the_deadline_ran_out() -> None:
    clock = FakeClock()
    exchange = PiecesExchange(clock, ResponseHead(400), [b"first ", b"second", b"third"], read_cost=1.0)
    assert error_body(exchange, clock, deadline=2.0, limit=100) == b"first second"
    assert exchange.reads == [2.0, 1.0]


def test_a_head_that_never_comes_is_stalled_naming_the_wait_in_milliseconds() -> None:
    clock = FakeClock()
    exchange = PiecesExchange(clock, TIMED_OUT, [])
    limits = FetchLimits(head_wait_s=1.5, body_wait_s=1.0, body_bytes=100, error_body_bytes=100)
    with pytest.raises(Stalled) as caught:
        fetch(OneExchangeTransport(exchange), clock, "GET", "/props", None, limits)
    assert str(caught.value) == "GET /props: no answer within 1500 ms"
    assert exchange.closed


def test_an_error_answer_keeps_its_body_up_to_the_configured_limit_even_past_4_kib() -> None:
    clock = FakeClock()
    body = b"x" * 6000
    exchange = PiecesExchange(clock, ResponseHead(500), [body])
    limits = FetchLimits(head_wait_s=1.0, body_wait_s=1.0, body_bytes=100, error_body_bytes=8192)
    with pytest.raises(HttpError) as caught:
        fetch(OneExchangeTransport(exchange), clock, "GET", "/slots", None, limits)
    assert caught.value.status == 500
    assert caught.value.body == body.decode()
    assert exchange.closed


class AsyncPiecesExchange(PiecesExchange):
    """`PiecesExchange` awaited."""

    async def head(self, timeout: float) -> ResponseHead | TimedOut:  # type: ignore[override]
        return PiecesExchange.head(self, timeout)

    async def read(self, timeout: float) -> bytes | TimedOut:  # type: ignore[override]
        return PiecesExchange.read(self, timeout)


class AsyncOneExchangeTransport(OneExchangeTransport):
    async def open(  # type: ignore[override]
        self, method: str, path: str, body: bytes | None = None, *, timeout: float, cancel: object = None
    ) -> PiecesExchange:
        return self.exchange


@pytest.mark.asyncio
async def test_an_awaited_error_answer_keeps_its_body_up_to_the_configured_limit_even_past_4_kib() -> None:
    clock = FakeClock()
    body = b"x" * 6000
    exchange = AsyncPiecesExchange(clock, ResponseHead(500), [body])
    limits = FetchLimits(head_wait_s=1.0, body_wait_s=1.0, body_bytes=100, error_body_bytes=8192)
    with pytest.raises(HttpError) as caught:
        await fetch_async(AsyncOneExchangeTransport(exchange), AsyncFakeClock(clock), "GET", "/slots", None, limits)
    assert caught.value.status == 500
    assert caught.value.body == body.decode()
    assert exchange.closed
