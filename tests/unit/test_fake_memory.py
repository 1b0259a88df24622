"""The in-memory fakes: a clock that moves only when told, a transport that replays scripts on it,
and a slot probe set by hand. No sockets, no threads, no sleeps."""

from __future__ import annotations

import math

import pytest

from adapters.fake_server import (
    NEVER,
    End,
    FakeClock,
    FakeSlotProbe,
    Piece,
    Raw,
    RecordedRequest,
    Reply,
    ScriptedTransport,
    json_reply,
    raw_reply,
    silence,
    sse_reply,
)
from app._sync.fetch import read_all
from domain.errors import ConnectError, ProtocolError, Stalled, StreamClosedEarly
from ports import Clock, Exchange, SlotProbe, SlotState, Transport
from ports.transport import TIMED_OUT, ResponseHead

CHAT = "/v1/chat/completions"


# -- the clock -----------------------------------------------------------------------------------


def test_the_clock_starts_where_told_and_moves_only_when_told() -> None:
    clock = FakeClock(start=100.0)
    assert clock.now() == clock.now() == 100.0
    clock.advance(1.5)
    clock.sleep(0.5)
    clock.sleep(0)
    assert clock.now() == 102.0
    assert isinstance(clock, Clock)


@pytest.mark.parametrize("seconds", [-0.001, -1.0, math.nan])
def test_the_clock_refuses_to_go_backwards(seconds: float) -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(seconds)
    with pytest.raises(ValueError, match="backwards"):
        clock.sleep(seconds)
    assert clock.now() == 0.0


# -- timing of a scripted exchange ---------------------------------------------------------------


def make(*replies: Reply | Raw, path: str = CHAT) -> tuple[FakeClock, ScriptedTransport]:
    clock = FakeClock()
    transport = ScriptedTransport(clock, {("POST", path): list(replies)}, header_bytes=16384)
    assert isinstance(transport, Transport)
    return clock, transport


def test_each_piece_delay_advances_the_clock_exactly() -> None:
    clock, transport = make(sse_reply([{"n": 0}, {"n": 1}], delay_s=0.5, head_delay_s=2.0))
    exchange = transport.open("POST", CHAT, b"{}", timeout=1.0)
    assert isinstance(exchange, Exchange)
    head = exchange.head(10.0)
    assert isinstance(head, ResponseHead) and head.status == 200
    assert head.header("content-type") == "text/event-stream"
    assert clock.now() == 2.0
    assert exchange.read(10.0) == b'data: {"n":0}\n\n'
    assert clock.now() == 2.5
    assert exchange.read(10.0) == b'data: {"n":1}\n\n'
    assert exchange.read(10.0) == b"data: [DONE]\n\n"
    assert exchange.read(10.0) == b""
    assert exchange.read(10.0) == b""
    assert clock.now() == 3.5


def test_a_read_shorter_than_the_next_delay_costs_its_timeout_and_times_out() -> None:
    clock, transport = make(Reply(pieces=[Piece(0.3, b"abc")]))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(0.1) is TIMED_OUT
    assert clock.now() == pytest.approx(0.1)
    assert exchange.read(0.1) is TIMED_OUT
    assert exchange.read(1.0) == b"abc"
    assert clock.now() == pytest.approx(0.3)


def test_a_head_that_is_late_times_out_and_arrives_later() -> None:
    clock, transport = make(json_reply({}, head_delay_s=5.0))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.head(4.0) is TIMED_OUT
    assert clock.now() == 4.0
    head = exchange.head(4.0)
    assert isinstance(head, ResponseHead)
    assert clock.now() == 5.0
    assert exchange.head(0) is head


def test_time_spent_elsewhere_counts_towards_the_script() -> None:
    # The server's timeline runs on without the reader: a slot poll that took 2 s of fake time
    # leaves a piece due after 1 s ready at once.
    clock, transport = make(Reply(pieces=[Piece(1.0, b"x")]))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    clock.advance(2.0)
    assert exchange.read(0) == b"x"
    assert clock.now() == 2.0


def test_a_head_that_never_comes_times_out_forever() -> None:
    clock, transport = make(Reply(head_delay_s=NEVER))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    for _ in range(3):
        assert exchange.head(5.0) is TIMED_OUT
    assert exchange.read(5.0) is TIMED_OUT
    assert clock.now() == 20.0


def test_silence_after_the_pieces_times_out_forever() -> None:
    clock, transport = make(sse_reply([{"n": 0}], done=False, end=End.SILENCE))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(1.0) == b'data: {"n":0}\n\n'
    assert exchange.read(30.0) is TIMED_OUT
    assert clock.now() == 30.0


def test_silence_before_any_byte() -> None:
    clock, transport = make(silence())
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.head(5.0) is TIMED_OUT
    assert clock.now() == 5.0


# -- ends ----------------------------------------------------------------------------------------


def test_reset_cuts_a_chunked_stream_and_the_failure_repeats() -> None:
    _, transport = make(sse_reply([{"n": 0}], done=False, end=End.RESET, delay_s=1.0))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(5.0) == b'data: {"n":0}\n\n'
    for _ in range(2):
        with pytest.raises(StreamClosedEarly, match=r"after chunk 1 \(15 body bytes\)"):
            exchange.read(5.0)


@pytest.mark.parametrize("end", list(End))
def test_a_content_length_body_that_arrived_whole_ends_cleanly_whatever_the_end(end: End) -> None:
    clock, transport = make(Reply(pieces=[Piece(0, b"ab"), Piece(0, b"cd")], end=end))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert read_all(exchange, clock, 100, 1.0) == b"abcd"


def test_a_content_length_body_that_is_short_is_cut() -> None:
    _, transport = make(Reply(headers=[("Content-Length", "10")], pieces=[Piece(0, b"abc")]))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(1.0) == b"abc"
    with pytest.raises(StreamClosedEarly, match="3 of 10"):
        exchange.read(1.0)


def test_bytes_past_the_content_length_are_not_body() -> None:
    clock, transport = make(Reply(headers=[("Content-Length", "3")], pieces=[Piece(0, b"abcdef")]))
    assert read_all(transport.open("POST", CHAT, timeout=1.0), clock, 100, 1.0) == b"abc"


def test_empty_pieces_are_delays_only() -> None:
    clock, transport = make(Reply(pieces=[Piece(1.0, b""), Piece(1.0, b"x")], chunked=True))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(5.0) == b"x"
    assert clock.now() == 2.0


# -- read_all and close --------------------------------------------------------------------------


def test_read_all_is_stalled_when_the_body_takes_longer_than_its_timeout() -> None:
    clock, transport = make(Reply(pieces=[Piece(0.5, b"a"), Piece(0.5, b"b")]))
    with pytest.raises(Stalled, match="1 bytes read"):
        read_all(transport.open("POST", CHAT, timeout=1.0), clock, 100, 0.8)
    assert clock.now() == pytest.approx(0.8)


def test_read_all_refuses_a_body_over_its_limit() -> None:
    clock, transport = make(Reply(pieces=[Piece(0, b"x" * 11)]), Reply(pieces=[Piece(0, b"x" * 11)], chunked=True))
    with pytest.raises(ProtocolError, match="Content-Length 11 is over the 10-byte body limit"):
        read_all(transport.open("POST", CHAT, timeout=1.0), clock, 10, 1.0)
    with pytest.raises(ProtocolError, match="body over the 10-byte limit"):
        read_all(transport.open("POST", CHAT, timeout=1.0), clock, 10, 1.0)


def test_close_is_recorded_with_its_time_and_later_reads_fail() -> None:
    clock, transport = make(sse_reply([{"n": 0}], delay_s=1.0))
    exchange = transport.open("POST", CHAT, b'{"x":1}', timeout=1.0)
    clock.advance(0.25)
    exchange.close()
    exchange.close()
    request = transport.requests[0]
    assert request.client_closed.is_set() and request.closed_at == 0.25
    with pytest.raises(StreamClosedEarly):
        exchange.read(1.0)
    with pytest.raises(StreamClosedEarly):
        exchange.head(1.0)


def test_requests_are_recorded_as_the_real_transport_sends_them() -> None:
    clock, transport = make(json_reply({}))
    clock.advance(3.0)
    transport.open("POST", CHAT + "?q=1", b'{"a":1}', timeout=1.0)
    (request,) = transport.requests
    assert (request.method, request.target, request.path, request.body, request.time) == (
        "POST",
        CHAT + "?q=1",
        CHAT,
        b'{"a":1}',
        3.0,
    )
    assert request.headers == (
        ("host", "localhost"),
        ("content-type", "application/json"),
        ("content-length", "7"),
        ("connection", "close"),
    )
    assert request.json() == {"a": 1}


def test_a_refusing_transport_raises_connect_error_naming_the_path() -> None:
    transport = ScriptedTransport(FakeClock(), socket_path="/run/x.sock")
    transport.refusing = True
    with pytest.raises(ConnectError, match=r"cannot connect to /run/x\.sock: connection refused"):
        transport.open("GET", "/slots", timeout=1.0)
    assert transport.requests == []


def test_routes_queue_and_repeat_and_unrouted_paths_get_404() -> None:
    transport = ScriptedTransport(FakeClock())
    transport.route("GET", "/health", json_reply({"n": 1}), json_reply({"n": 2}))

    def status(path: str) -> int:
        head = transport.open("GET", path, timeout=1.0).head(1.0)
        assert isinstance(head, ResponseHead)
        return head.status

    assert [read_all(transport.open("GET", "/health", timeout=1.0), transport.clock, 100, 1.0) for _ in range(3)] == [
        b'{"n":1}',
        b'{"n":2}',
        b'{"n":2}',
    ]
    assert status("/nope") == 404


def test_a_callable_route_sees_the_request() -> None:
    def by_slot(request: RecordedRequest) -> Reply:
        return json_reply({"slot": request.json()["id_slot"]})

    transport = ScriptedTransport(FakeClock(), {("POST", CHAT): by_slot})
    exchange = transport.open("POST", CHAT, b'{"id_slot":3}', timeout=1.0)
    assert read_all(exchange, transport.clock, 100, 1.0) == b'{"slot":3}'


# -- raw scripts, parsed as the real client parses them ------------------------------------------

RAW = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext\r\nde\r\n0\r\nX-T: 1\r\n\r\n"


def test_a_raw_script_is_de_chunked_at_the_pace_of_its_pieces() -> None:
    clock, transport = make(raw_reply(RAW, delay_s=0.5))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    head = exchange.head(1.0)
    assert isinstance(head, ResponseHead) and head.header("transfer-encoding") == "chunked"
    assert clock.now() == 0.5
    assert [exchange.read(1.0), exchange.read(1.0), exchange.read(1.0)] == [b"abc", b"de", b""]
    assert clock.now() == 2.0


@pytest.mark.parametrize(
    ("raw", "end", "error", "match"),
    [
        (b"", End.CLOSE, StreamClosedEarly, "closed before any response byte"),
        (b"HTTP/1.1 200 OK\r\n", End.RESET, StreamClosedEarly, "inside the response head"),
        (RAW[:60], End.CLOSE, StreamClosedEarly, r"after chunk 1 \(3 body bytes\)"),
        (b"garbage\r\n\r\n", End.CLOSE, ProtocolError, "malformed response"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            End.CLOSE,
            ProtocolError,
            "both Transfer-Encoding and Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * 20000 + b"\r\n\r\n", End.CLOSE, ProtocolError, "16384-byte limit"),
    ],
)
def test_a_broken_raw_script_fails_like_the_socket_would(raw: bytes, end: End, error: type, match: str) -> None:
    _, transport = make(Raw([Piece(0, raw)], end))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    with pytest.raises(error, match=match):
        while exchange.read(1.0):
            pass


def test_a_raw_script_ending_in_silence_holds() -> None:
    _, transport = make(Raw([Piece(0, RAW[:60])], End.SILENCE))
    exchange = transport.open("POST", CHAT, timeout=1.0)
    assert exchange.read(1.0) == b"abc"
    assert exchange.read(1.0) is TIMED_OUT


# -- the slot probe fake -------------------------------------------------------------------------


def test_the_fake_slot_probe_answers_what_it_was_told_and_records_questions() -> None:
    probe = FakeSlotProbe({0: SlotState.BUSY})
    assert isinstance(probe, SlotProbe)
    assert probe.state(0) is SlotState.BUSY
    assert probe.state(1) is SlotState.UNAVAILABLE
    probe.states[1] = SlotState.IDLE
    assert probe.state(1) is SlotState.IDLE
    assert probe.asked == [0, 1, 1]
    with pytest.raises(ValueError):
        probe.state(-1)
