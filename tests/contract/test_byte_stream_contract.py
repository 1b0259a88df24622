"""The `ByteStream` contract (see `ports.stream`), run against the scripted in-memory stream on a
fake clock and against a Unix socket to the fake server, from the same scripts; and the
schedule both replay (`adapters.fake_server.wire`).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from adapters.fake_server import End, FakeClock, FakeServer, Piece, Raw, RecordedRequest, Reply, Routes, sse_reply
from adapters.fake_server.memory import ScriptedStream
from adapters.fake_server.wire import RequestReader, Wire, on_wire
from adapters.uds_http.sockets import SocketStream
from ports import ByteStream
from ports.transport import TIMED_OUT

pytestmark = pytest.mark.timeout(20)

REQUEST = b"GET /s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


@dataclass
class Harness:
    stream: ByteStream
    requests: list[RecordedRequest]
    clock: FakeClock | None

    def recv_until_eof(self, timeout: float = 2.0) -> bytes:
        data = b""
        while piece := self.stream.recv(65536, timeout):
            assert piece is not TIMED_OUT
            assert isinstance(piece, bytes)
            data += piece
        return data


Play = Callable[[Reply | Raw], Harness]


@pytest.fixture(params=["memory", "uds"])
def play(request: pytest.FixtureRequest) -> Iterator[Play]:
    """`play(script)`: a stream whose peer answers the request with `script`; the request sent."""
    servers: list[FakeServer] = []
    streams: list[ByteStream] = []

    def start(script: Reply | Raw) -> Harness:
        if request.param == "memory":
            clock = FakeClock()
            recorded: list[RecordedRequest] = []
            stream: ByteStream = ScriptedStream(clock, Routes({("GET", "/s"): script}), recorded)
            harness = Harness(stream, recorded, clock)
        else:
            server = FakeServer({("GET", "/s"): script})
            server.start()
            servers.append(server)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(server.socket_path)
            stream = SocketStream(sock)
            harness = Harness(stream, server.requests, None)
        streams.append(stream)
        stream.send_all(REQUEST, 1.0)
        return harness

    yield start
    for stream in streams:
        stream.close()
    for server in servers:
        server.stop()


def test_the_reply_comes_whole_then_eof_for_ever(play: Play) -> None:
    harness = play(Raw([Piece(0, b"HTTP/1.1 200 OK\r\n\r\nabc")]))
    assert harness.recv_until_eof() == b"HTTP/1.1 200 OK\r\n\r\nabc"
    assert harness.stream.recv(10, 0.5) == b""
    assert harness.stream.recv(10, 0.0) == b""


def test_a_timeout_shorter_than_the_next_piece_consumes_nothing(play: Play) -> None:
    harness = play(Raw([Piece(0, b"a"), Piece(0.15, b"b")]))
    assert harness.stream.recv(10, 2.0) == b"a"
    assert harness.stream.recv(10, 0.03) is TIMED_OUT
    assert harness.stream.recv(10, 0.0) is TIMED_OUT  # a zero timeout polls
    assert harness.stream.recv(10, -1.0) is TIMED_OUT
    assert harness.stream.recv(10, 2.0) == b"b"
    if harness.clock is not None:
        assert harness.clock.now() == pytest.approx(0.15)
    assert harness.stream.recv(10, 2.0) == b""


def test_recv_returns_at_most_max_bytes_and_the_rest_follows(play: Play) -> None:
    harness = play(Raw([Piece(0, b"0123456789")]))
    first = harness.stream.recv(4, 2.0)
    assert isinstance(first, bytes) and 1 <= len(first) <= 4
    assert first + harness.recv_until_eof() == b"0123456789"


def test_silence_times_out_and_keeps_the_connection(play: Play) -> None:
    harness = play(Raw([Piece(0, b"x")], End.SILENCE))
    assert harness.stream.recv(10, 2.0) == b"x"
    assert harness.stream.recv(10, 0.05) is TIMED_OUT
    assert not harness.requests[0].client_closed.is_set()


def test_the_request_sent_is_recorded_as_the_server_records_it(play: Play) -> None:
    harness = play(Raw([Piece(0, b"x")]))
    assert harness.recv_until_eof() == b"x"
    (request,) = harness.requests
    assert (request.method, request.target, request.headers) == (
        "GET",
        "/s",
        (("host", "localhost"), ("connection", "close")),
    )


def test_shutdown_ends_a_waiting_recv_and_the_peer_sees_the_close(play: Play) -> None:
    harness = play(Raw([Piece(0, b"x")], End.SILENCE))
    assert harness.stream.recv(10, 2.0) == b"x"
    harness.stream.shutdown()
    harness.stream.shutdown()
    assert harness.stream.recv(10, 2.0) == b""
    assert harness.requests[0].client_closed.wait(2.0)


def test_close_is_idempotent_and_the_peer_sees_it(play: Play) -> None:
    harness = play(Raw([Piece(0, b"x")], End.SILENCE))
    assert harness.stream.recv(10, 2.0) == b"x"
    harness.stream.close()
    harness.stream.close()
    assert harness.requests[0].client_closed.wait(2.0)


# -- the schedule ----------------------------------------------------------------------------------


def test_a_reply_writes_its_head_after_its_delay_and_pieces_due_together_as_one_write() -> None:
    reply = Reply(200, [("X", "1")], [Piece(0, b"ab"), Piece(0, b"cd"), Piece(0.5, b"ef")], head_delay_s=2.0)
    wire = on_wire(reply)
    head = reply.wire_head()
    assert wire == Wire(((2.0, head + b"abcd"), (0.5, b"ef")), 0.0, End.CLOSE)


def test_a_chunked_reply_frames_each_piece_and_ends_with_the_last_chunk_only_on_close() -> None:
    stream = sse_reply(["a"], delay_s=1.0)
    wire = on_wire(stream)
    assert [after for after, _ in wire.writes] == [0.0, 1.0, 1.0]
    assert wire.writes[1][1] == b"9\r\ndata: a\n\n\r\n"
    assert wire.writes[2][1].endswith(b"\r\n0\r\n\r\n")
    cut = on_wire(sse_reply(["a"], done=False, end=End.RESET))
    assert not cut.writes[-1][1].endswith(b"0\r\n\r\n") and cut.end is End.RESET


def test_empty_pieces_are_delays_and_a_trailing_delay_comes_before_the_end() -> None:
    wire = on_wire(Raw([Piece(1.0, b""), Piece(1.0, b"x"), Piece(3.0, b"")], End.CLOSE))
    assert wire == Wire(((2.0, b"x"),), 3.0, End.CLOSE)
    assert on_wire(Raw((), End.SILENCE)) == Wire((), 0.0, End.SILENCE)


def test_a_head_that_never_comes_is_due_at_infinity() -> None:
    wire = on_wire(Reply(head_delay_s=math.inf))
    assert math.isinf(wire.writes[0][0])


def test_the_request_reader_waits_for_the_whole_body() -> None:
    reader = RequestReader()
    raw = b'POST /x?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 7\r\n\r\n{"a":1}'
    assert reader.feed(raw[:-3], 1.0) is None
    request = reader.feed(raw[-3:], 2.0)
    assert request is not None
    assert (request.method, request.target, request.path, request.body, request.time) == (
        "POST",
        "/x?q=1",
        "/x",
        b'{"a":1}',
        2.0,
    )


def test_a_socket_stream_times_out_without_a_fake_clock() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = SocketStream(ours)
    try:
        started = time.monotonic()
        assert stream.recv(10, 0.05) is TIMED_OUT
        assert time.monotonic() - started >= 0.04
        theirs.sendall(b"ok")
        assert stream.recv(10, 1.0) == b"ok"
    finally:
        stream.close()
        theirs.close()
