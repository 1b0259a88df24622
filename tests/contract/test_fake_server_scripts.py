"""The scripted fake server: routing, recording, pacing, ends, and a clean shutdown every time.

Timing checks use 50-200 ms delays and generous upper bounds, so a loaded machine slows them
down without failing them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from adapters.fake_server import (
    NEVER,
    End,
    FakeServer,
    Piece,
    Raw,
    RecordedRequest,
    Reply,
    error_reply,
    json_reply,
    raw_reply,
    silence,
    slots_reply,
    split_recorded,
    sse_reply,
)
from adapters.system import SystemClock
from adapters.uds_http._sync.transport import UdsTransport
from app._sync.fetch import read_all
from domain.errors import StreamClosedEarly
from domain.sse import SseData, SseDecoder, SseDone
from ports.transport import TIMED_OUT, ResponseHead

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[2] / "src"
CHAT = "/v1/chat/completions"
CLOCK = SystemClock()
HEADER_BYTES = 16384


def fetch(server: FakeServer, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open(method, path, body, timeout=2.0)
    with exchange:
        head = exchange.head(2.0)
        assert isinstance(head, ResponseHead)
        return head.status, read_all(exchange, CLOCK, 1 << 20, 2.0)


def raw_exchange(server: FakeServer, request: bytes) -> bytes:
    """Send raw request bytes and read the raw response until the server closes."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2.0)
        sock.connect(server.socket_path)
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


# -- lifecycle -----------------------------------------------------------------------------------


def test_the_server_is_ready_on_entry_and_gone_after_exit() -> None:
    with FakeServer({("GET", "/health"): json_reply({"status": "ok"})}) as server:
        path = server.socket_path
        assert fetch(server, "GET", "/health") == (200, b'{"status":"ok"}')
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.dirname(path))


def test_the_socket_path_is_unknown_before_start() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        _ = FakeServer().socket_path


def test_exit_returns_promptly_with_a_silent_connection_and_a_slow_script_open() -> None:
    started = time.monotonic()
    with FakeServer({("GET", "/silent"): silence(), ("GET", "/slow"): Reply(pieces=[Piece(60, b"x")])}) as server:
        quiet = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("GET", "/silent", timeout=1.0)
        slow = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("GET", "/slow", timeout=1.0)
        assert quiet.head(0.05) is TIMED_OUT
        assert isinstance(slow.head(1.0), ResponseHead)
    assert time.monotonic() - started < 5.0
    assert threading.active_count() < 50
    quiet.close()
    slow.close()


def test_an_explicit_socket_path_replaces_a_stale_socket_and_is_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "llama.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()
    with FakeServer({("GET", "/health"): json_reply({})}, socket_path=path) as server:
        assert server.socket_path == path
        assert fetch(server, "GET", "/health")[0] == 200
    assert not os.path.exists(path)


def test_a_script_that_raises_fails_the_test_at_exit() -> None:
    def broken(request: RecordedRequest) -> Reply:
        raise KeyError("no such scenario")

    server = FakeServer({("GET", "/x"): broken})
    # The client sees a cut; the test sees the script's failure when the server stops.
    with pytest.raises(RuntimeError, match="no such scenario"), server, pytest.raises(StreamClosedEarly):
        fetch(server, "GET", "/x")


# -- routing -------------------------------------------------------------------------------------


def test_routes_match_method_and_path_without_the_query() -> None:
    with FakeServer({("GET", "/slots"): slots_reply([True, False])}) as server:
        status, body = fetch(server, "GET", "/slots?fail_on_no_slot=1")
        assert status == 200 and b'"is_processing":true' in body
        assert fetch(server, "POST", "/slots", b"{}")[0] == 404
        status, body = fetch(server, "GET", "/props")
        assert (status, body) == (404, b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}')
        assert server.requests[0].target == "/slots?fail_on_no_slot=1"
        assert server.requests[0].path == "/slots"


def test_a_route_serves_its_replies_one_per_connection_and_repeats_the_last() -> None:
    with FakeServer() as server:
        server.route("GET", "/health", error_reply(503, "Loading model", "unavailable_error"), json_reply({"ok": 1}))
        assert [fetch(server, "GET", "/health")[0] for _ in range(4)] == [503, 200, 200, 200]


def test_a_callable_route_builds_the_reply_from_the_request() -> None:
    def echo(request: RecordedRequest) -> Reply:
        return json_reply({"got": request.json(), "type": request.header("Content-Type")})

    with FakeServer({("POST", "/echo"): echo}) as server:
        assert fetch(server, "POST", "/echo", b'{"n": 1}') == (200, b'{"got":{"n":1},"type":"application/json"}')


def test_a_default_reply_serves_every_unrouted_request() -> None:
    with FakeServer(default=json_reply({"any": True})) as server:
        assert fetch(server, "DELETE", "/whatever") == (200, b'{"any":true}')


# -- recording -----------------------------------------------------------------------------------


def test_every_request_is_recorded_with_exact_body_bytes_headers_and_time() -> None:
    body = b'{"s":"\xc5\xbc\\u0000"}\x00\xff'
    with FakeServer({("POST", CHAT): json_reply({})}) as server:
        before = time.monotonic()
        request = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\nX-Case: Mixed\r\n\r\n"
        raw_exchange(server, request % len(body) + body)
        after = time.monotonic()
    (recorded,) = server.requests
    assert (recorded.method, recorded.target, recorded.path) == ("POST", "/v1/chat/completions?x=1", CHAT)
    assert recorded.body == body
    assert recorded.headers == (("host", "a"), ("content-length", str(len(body))), ("x-case", "Mixed"))
    assert before <= recorded.time <= after


def test_a_malformed_request_gets_400_and_is_not_recorded() -> None:
    with FakeServer() as server:
        answer = raw_exchange(server, b"NOT HTTP\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert server.requests == []


def test_the_server_notices_the_client_closing_mid_stream() -> None:
    reply = sse_reply([{"n": i} for i in range(50)], delay_s=0.05)
    with FakeServer({("POST", CHAT): reply}) as server:
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
        assert exchange.read(1.0) == b'data: {"n":0}\n\n'
        exchange.close()
        closed = time.monotonic()
        request = server.requests[0]
        assert request.client_closed.wait(2.0)
        assert request.closed_at is not None and request.closed_at - closed < 1.0


def test_silence_holds_the_connection_until_the_client_closes() -> None:
    reply = sse_reply([{"n": 0}], done=False, end=End.SILENCE)
    with FakeServer({("POST", CHAT): reply}) as server:
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
        assert exchange.read(1.0) == b'data: {"n":0}\n\n'
        assert exchange.read(0.1) is TIMED_OUT
        assert not server.requests[0].client_closed.is_set()
        exchange.close()
        assert server.requests[0].client_closed.wait(2.0)


def test_a_clean_end_still_sees_the_client_close_afterwards() -> None:
    with FakeServer({("GET", "/health"): json_reply({})}) as server:
        fetch(server, "GET", "/health")
        assert server.requests[0].client_closed.wait(2.0)


# -- ends and pacing ---------------------------------------------------------------------------


def read_events(server: FakeServer) -> list[object]:
    exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
    decoder = SseDecoder()
    events: list[object] = []
    with exchange:
        while True:
            data = exchange.read(2.0)
            assert data is not TIMED_OUT
            if not data:
                return events + list(decoder.end())
            events += decoder.feed(data)  # type: ignore[arg-type]


def test_an_sse_reply_is_llama_server_shaped() -> None:
    with FakeServer({("POST", CHAT): sse_reply([{"a": 1}, "[not json]", b": ping\n\n"])}) as server:
        answer = raw_exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert answer == (
        b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nX-Accel-Buffering: no\r\n"
        b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b'Connection: close\r\n\r\nf\r\ndata: {"a":1}\n\n\r\n12\r\ndata: [not json]\n\n\r\n8\r\n: ping\n\n\r\n'
        b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    )


def test_reset_cuts_a_chunked_stream_before_its_last_chunk() -> None:
    reply = sse_reply([{"a": 1}], done=False, end=End.RESET)
    with FakeServer({("POST", CHAT): reply}) as server, pytest.raises(StreamClosedEarly, match="zero-size chunk"):
        read_events(server)


def test_close_ends_a_chunked_stream_cleanly() -> None:
    with FakeServer({("POST", CHAT): sse_reply([{"a": 1}])}) as server:
        assert read_events(server) == [SseData('{"a":1}'), SseDone()]


def test_a_short_content_length_reply_is_cut() -> None:
    reply = Reply(200, [("Content-Length", "10")], [Piece(0, b"abc")])
    with FakeServer({("GET", "/x"): reply}) as server, pytest.raises(StreamClosedEarly, match="3 of 10"):
        fetch(server, "GET", "/x")


def test_pieces_arrive_after_their_delays() -> None:
    reply = sse_reply([{"n": 0}, {"n": 1}], delay_s=0.1, head_delay_s=0.1)
    with FakeServer({("POST", CHAT): reply}) as server:
        start = time.monotonic()
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
        with exchange:
            assert exchange.head(0.03) is TIMED_OUT
            assert isinstance(exchange.head(1.0), ResponseHead)
            head_at = time.monotonic() - start
            assert exchange.read(0.03) is TIMED_OUT
            assert exchange.read(1.0) == b'data: {"n":0}\n\n'
            first_at = time.monotonic() - start
            assert exchange.read(1.0) == b'data: {"n":1}\n\n'
            second_at = time.monotonic() - start
    assert 0.09 <= head_at < 1.0
    assert first_at - head_at >= 0.07
    assert second_at - first_at >= 0.07


def test_a_head_that_never_comes_waits_for_the_client_to_give_up() -> None:
    with FakeServer({("POST", CHAT): Reply(head_delay_s=NEVER)}) as server:
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
        assert exchange.head(0.05) is TIMED_OUT
        exchange.close()
        assert server.requests[0].client_closed.wait(2.0)


def test_scripts_refuse_negative_delays() -> None:
    with pytest.raises(ValueError):
        Piece(-0.1, b"x")
    with pytest.raises(ValueError):
        Reply(head_delay_s=-1)


# -- raw recorded responses ----------------------------------------------------------------------

RAW = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'f\r\ndata: {"a":1}\n\n\r\n3;ext\r\nxyz\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n'
)


def test_a_raw_reply_is_served_byte_for_byte() -> None:
    with FakeServer({("POST", CHAT): raw_reply(RAW)}) as server:
        answer = raw_exchange(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert answer == RAW


def test_a_raw_reply_can_be_paced_in_small_pieces() -> None:
    with FakeServer({("POST", CHAT): raw_reply(RAW, piece_bytes=7, delay_s=0.002)}) as server:
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=1.0)
        with exchange:
            assert read_all(exchange, CLOCK, 1000, 5.0) == b'data: {"a":1}\n\nxyzdata: [DONE]\n\n'


def test_split_recorded_cuts_at_the_head_and_each_chunk() -> None:
    assert split_recorded(RAW) == [
        RAW[: RAW.index(b"\r\n\r\n") + 4],
        b'f\r\ndata: {"a":1}\n\n\r\n',
        b"3;ext\r\nxyz\r\n",
        b"e\r\ndata: [DONE]\n\n\r\n",
        b"0\r\n\r\n",
    ]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        RAW[:-3],
        RAW + b"trailing",
    ],
)
def test_split_recorded_always_adds_up_to_the_input(raw: bytes) -> None:
    assert b"".join(split_recorded(raw)) == raw


def test_a_raw_reply_with_fixed_pieces_adds_up_to_the_input() -> None:
    script = raw_reply(RAW, piece_bytes=10, delay_s=0.5, end=End.RESET)
    assert isinstance(script, Raw) and script.end is End.RESET
    assert b"".join(p.data for p in script.pieces) == RAW
    assert {p.delay_s for p in script.pieces} == {0.5}
    with pytest.raises(ValueError):
        raw_reply(RAW, piece_bytes=0)


# -- the command line ----------------------------------------------------------------------------


def test_the_command_line_serves_a_transcript_until_terminated(tmp_path: Path) -> None:
    transcript = tmp_path / "response.raw"
    transcript.write_bytes(RAW)
    path = str(tmp_path / "llama.sock")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "adapters.fake_server", "--socket", path, "--transcript", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith(f"serving {transcript} ({len(RAW)} bytes) on {path}")
        exchange = UdsTransport(path, header_bytes=HEADER_BYTES).open("POST", CHAT, b"{}", timeout=2.0)
        with exchange:
            assert read_all(exchange, CLOCK, 1000, 5.0) == b'data: {"a":1}\n\nxyzdata: [DONE]\n\n'
        slots = UdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/slots", timeout=2.0)
        with slots:
            assert read_all(slots, CLOCK, 1000, 5.0) == (
                b'[{"id":0,"n_ctx":4096,"speculative":false,"is_processing":false},'
                b'{"id":1,"n_ctx":4096,"speculative":false,"is_processing":false}]'
            )
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    assert "stopped after 2 requests" in out
    assert not os.path.exists(path)


def test_the_command_line_refuses_a_missing_transcript(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [
        sys.executable,
        "-m",
        "adapters.fake_server",
        "--socket",
        str(tmp_path / "s"),
        "--transcript",
        str(tmp_path / "nothing.raw"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=20, check=False)
    assert run.returncode == 2
    assert "cannot read" in run.stderr
