"""The `Transport` contract (see `ports.transport`), run against the in-memory scripted transport
and against the real Unix-socket adapter talking to the fake server, from the same scripts.

Delays are 50-200 ms: on the fake clock they cost nothing, on the socket they are short enough
to keep the suite fast and long enough to be seen.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adapters.fake_server import (
    End,
    FakeClock,
    FakeServer,
    Piece,
    Raw,
    RecordedRequest,
    Reply,
    RouteItem,
    ScriptedTransport,
    error_reply,
    json_reply,
    sse_reply,
)
from adapters.system import SystemClock
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.sockets import SocketStream
from app._sync.fetch import read_all
from domain.errors import ConnectError, ProtocolError, Stalled, StreamClosedEarly
from ports import Clock, Exchange, Transport
from ports.transport import TIMED_OUT, ResponseHead

pytestmark = pytest.mark.timeout(20)

CHAT = "/v1/chat/completions"
SLACK_S = 1.0  # how late a socket may be on a loaded machine; the fake clock is exact
HEADER_BYTES = 16384


@dataclass
class Harness:
    kind: str
    transport: Transport
    requests: list[RecordedRequest]
    routes: ScriptedTransport | FakeServer
    clock: FakeClock | None = None
    started: float = field(default_factory=time.monotonic)
    refused_path: str = ""

    def route(self, method: str, path: str, *replies: RouteItem) -> None:
        self.routes.route(method, path, *replies)

    @property
    def time(self) -> Clock:
        return self.clock if self.clock is not None else SystemClock()

    def elapsed(self) -> float:
        if self.clock is not None:
            return self.clock.now()
        return time.monotonic() - self.started

    def refusing(self) -> Transport:
        if isinstance(self.routes, ScriptedTransport):
            dead = ScriptedTransport(FakeClock(), socket_path=self.refused_path)
            dead.refusing = True
            return dead
        return UdsTransport(self.refused_path, header_bytes=HEADER_BYTES)

    def open(self, method: str = "POST", path: str = CHAT, body: bytes | None = b"{}") -> Exchange:
        return self.transport.open(method, path, body, timeout=1.0)


@pytest.fixture(params=["memory", "uds"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    dead_path = str(tmp_path / "dead.sock")
    if request.param == "memory":
        clock = FakeClock()
        scripted = ScriptedTransport(clock, header_bytes=HEADER_BYTES)
        yield Harness("memory", scripted, scripted.requests, scripted, clock, refused_path=dead_path)
        return
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(dead_path)  # bound and not listening: refused
    try:
        with FakeServer() as server:
            transport = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES)
            yield Harness("uds", transport, server.requests, server, refused_path=dead_path)
    finally:
        stale.close()


def read_body(exchange: Exchange, timeout: float = 2.0) -> list[bytes]:
    pieces = []
    while True:
        piece = exchange.read(timeout)
        assert piece is not TIMED_OUT
        assert isinstance(piece, bytes)
        if not piece:
            return pieces
        pieces.append(piece)


# -- the happy path ------------------------------------------------------------------------------


def test_the_body_adds_up_to_the_script_and_ends_with_empty_bytes_for_ever(harness: Harness) -> None:
    harness.route("POST", CHAT, sse_reply([{"n": 0}, {"n": 1}], delay_s=0.01))
    exchange = harness.open()
    head = exchange.head(2.0)
    assert isinstance(head, ResponseHead)
    assert (head.status, head.header("Content-Type"), head.header("transfer-encoding")) == (
        200,
        "text/event-stream",
        "chunked",
    )
    assert b"".join(read_body(exchange)) == b'data: {"n":0}\n\ndata: {"n":1}\n\ndata: [DONE]\n\n'
    assert exchange.read(0.05) == b""
    assert exchange.read(0.0) == b""
    exchange.close()


def test_read_without_head_first_returns_the_body(harness: Harness) -> None:
    harness.route("GET", "/props", json_reply({"total_slots": 2}))
    exchange = harness.open("GET", "/props", None)
    assert read_body(exchange) == [b'{"total_slots":2}']
    head = exchange.head(0.0)
    assert isinstance(head, ResponseHead) and head.header("content-length") == "17"


def test_a_non_200_answer_comes_through_with_its_body(harness: Harness) -> None:
    harness.route("POST", CHAT, error_reply(400, "request (9000 tokens) exceeds the available context size"))
    exchange = harness.open()
    head = exchange.head(2.0)
    assert isinstance(head, ResponseHead) and head.status == 400
    assert b"exceeds the available context size" in read_all(exchange, harness.time, 4096, 2.0)


def test_the_request_is_recorded_as_sent(harness: Harness) -> None:
    harness.route("POST", CHAT, json_reply({}))
    read_all(harness.open(body=b'{"stream":true}'), harness.time, 100, 2.0)
    (request,) = harness.requests
    assert (request.method, request.path, request.body) == ("POST", CHAT, b'{"stream":true}')
    assert request.header("content-type") == "application/json"
    assert request.header("content-length") == "15"
    assert request.header("connection") == "close"


# -- timeouts ------------------------------------------------------------------------------------


def test_a_late_head_times_out_then_arrives_and_is_kept(harness: Harness) -> None:
    harness.route("POST", CHAT, json_reply({"a": 1}, head_delay_s=0.15))
    exchange = harness.open()
    assert exchange.head(0.05) is TIMED_OUT
    head = exchange.head(2.0)
    assert isinstance(head, ResponseHead)
    assert 0.15 - 0.02 <= harness.elapsed() < 0.15 + SLACK_S
    assert exchange.head(0.0) is head
    assert read_all(exchange, harness.time, 100, 1.0) == b'{"a":1}'


def test_a_read_times_out_when_the_next_piece_is_later_and_the_exchange_stays_usable(harness: Harness) -> None:
    harness.route("POST", CHAT, Reply(pieces=[Piece(0, b"a"), Piece(0.15, b"b")], chunked=True))
    exchange = harness.open()
    assert exchange.read(2.0) == b"a"
    assert exchange.read(0.05) is TIMED_OUT
    assert exchange.read(0.01) is TIMED_OUT  # the timeout may change on every read
    assert exchange.read(2.0) == b"b"
    assert 0.15 - 0.02 <= harness.elapsed() < 0.15 + SLACK_S
    assert exchange.read(2.0) == b""


def test_silence_after_some_pieces_times_out_and_stays_open(harness: Harness) -> None:
    harness.route("POST", CHAT, sse_reply([{"n": 0}], done=False, end=End.SILENCE))
    exchange = harness.open()
    assert exchange.read(2.0) == b'data: {"n":0}\n\n'
    assert exchange.read(0.05) is TIMED_OUT
    assert exchange.read(0.05) is TIMED_OUT
    assert not harness.requests[0].client_closed.is_set()
    exchange.close()


def test_read_all_that_takes_longer_than_its_timeout_is_stalled(harness: Harness) -> None:
    harness.route("GET", "/slots", Reply(pieces=[Piece(0, b"["), Piece(0.2, b"]")]))
    exchange = harness.open("GET", "/slots", None)
    with pytest.raises(Stalled):
        read_all(exchange, harness.time, 100, 0.05)
    assert harness.elapsed() < 0.2


def test_read_all_without_any_head_in_time_is_stalled(harness: Harness) -> None:
    harness.route("GET", "/slots", Raw((), End.SILENCE))
    with pytest.raises(Stalled):
        read_all(harness.open("GET", "/slots", None), harness.time, 100, 0.05)


# -- size limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True])
def test_read_all_over_its_limit_is_a_protocol_error_naming_the_limit(harness: Harness, chunked: bool) -> None:
    harness.route("GET", "/props", Reply(pieces=[Piece(0, b"x" * 60), Piece(0, b"y" * 60)], chunked=chunked))
    with pytest.raises(ProtocolError, match="100-byte"):
        read_all(harness.open("GET", "/props", None), harness.time, 100, 2.0)


def test_a_head_over_its_limit_is_a_protocol_error(harness: Harness) -> None:
    harness.route("GET", "/props", Reply(headers=[("X-Pad", "p" * 17000)]))
    with pytest.raises(ProtocolError, match="16384-byte limit"):
        harness.open("GET", "/props", None).head(2.0)


# -- cuts and garbage ----------------------------------------------------------------------------


def test_a_chunked_stream_cut_before_its_end_is_stream_closed_early(harness: Harness) -> None:
    harness.route("POST", CHAT, sse_reply([{"n": 0}], done=False, end=End.RESET))
    exchange = harness.open()
    assert exchange.read(2.0) == b'data: {"n":0}\n\n'
    with pytest.raises(StreamClosedEarly):
        exchange.read(2.0)


def test_a_short_content_length_body_is_stream_closed_early(harness: Harness) -> None:
    harness.route("GET", "/props", Reply(headers=[("Content-Length", "10")], pieces=[Piece(0, b"abc")]))
    with pytest.raises(StreamClosedEarly, match="3 of 10"):
        read_all(harness.open("GET", "/props", None), harness.time, 100, 2.0)


@pytest.mark.parametrize("end", [End.CLOSE, End.RESET])
def test_a_connection_cut_before_the_head_is_stream_closed_early(harness: Harness, end: End) -> None:
    harness.route("POST", CHAT, Raw((), end))
    with pytest.raises(StreamClosedEarly):
        harness.open().head(2.0)


def test_garbage_instead_of_a_response_is_a_protocol_error(harness: Harness) -> None:
    harness.route("POST", CHAT, Raw([Piece(0, b"SSH-2.0-OpenSSH\r\n\r\n")]))
    with pytest.raises(ProtocolError):
        harness.open().head(2.0)


def test_a_broken_chunk_is_a_protocol_error(harness: Harness) -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n"
    harness.route("POST", CHAT, Raw([Piece(0, raw)]))
    exchange = harness.open()
    assert exchange.read(2.0) == b"ok"
    with pytest.raises(ProtocolError):
        exchange.read(2.0)


# -- close and connect ---------------------------------------------------------------------------


def test_close_is_idempotent_the_server_sees_it_and_reads_after_it_fail(harness: Harness) -> None:
    harness.route("POST", CHAT, sse_reply([{"n": i} for i in range(20)], delay_s=0.05))
    exchange = harness.open()
    assert exchange.read(2.0) == b'data: {"n":0}\n\n'
    exchange.close()
    exchange.close()
    assert harness.requests[0].client_closed.wait(2.0)
    with pytest.raises(StreamClosedEarly):
        exchange.read(0.1)


def test_close_before_the_head_makes_head_fail(harness: Harness) -> None:
    harness.route("POST", CHAT, json_reply({}, head_delay_s=0.1))
    exchange = harness.open()
    exchange.close()
    with pytest.raises(StreamClosedEarly):
        exchange.head(0.5)


def test_a_refused_connection_is_a_connect_error_naming_the_path(harness: Harness) -> None:
    with pytest.raises(ConnectError, match=f"cannot connect to {harness.refused_path}: connection refused"):
        harness.refusing().open("GET", "/slots", timeout=1.0)


# -- a connection made ahead (`connect`, then `open(..., link=)`) ---------------------------------


def test_a_request_sent_on_a_connection_made_ahead_is_answered_as_any(harness: Harness) -> None:
    harness.route("POST", CHAT, json_reply({"ok": True}))
    link = harness.transport.connect(1.0)
    assert harness.requests == []  # connected, nothing sent
    exchange = harness.transport.open("POST", CHAT, b'{"a":1}', timeout=1.0, link=link)
    assert read_all(exchange, harness.time, 100, 2.0) == b'{"ok":true}'
    (request,) = harness.requests
    assert (request.method, request.path, request.body) == ("POST", CHAT, b'{"a":1}')
    if isinstance(harness.routes, FakeServer):
        assert harness.routes.accepted == 1  # on the connection made ahead, not on a new one


def test_a_malformed_request_on_a_connection_made_ahead_is_refused_and_the_connection_closed(
    harness: Harness,
) -> None:
    link = harness.transport.connect(1.0)
    with pytest.raises(ValueError):
        harness.transport.open("BAD METHOD", CHAT, b"{}", timeout=1.0, link=link)
    if harness.kind == "uds":
        assert isinstance(link, SocketStream)
        assert link._sock.fileno() == -1  # closed, not left to the garbage collector
    assert harness.requests == []


def test_connecting_ahead_to_a_refused_socket_is_a_connect_error_naming_the_path(harness: Harness) -> None:
    with pytest.raises(ConnectError, match=f"cannot connect to {harness.refused_path}: connection refused"):
        harness.refusing().connect(1.0)


def test_a_connection_from_another_kind_of_transport_is_refused_and_closed(harness: Harness) -> None:
    class Foreign:
        closed = False

        def close(self) -> None:
            self.closed = True

    foreign = Foreign()
    with pytest.raises(TypeError, match="sends on its own connections"):
        harness.transport.open("GET", "/slots", None, timeout=1.0, link=foreign)
    assert foreign.closed
    assert harness.requests == []
