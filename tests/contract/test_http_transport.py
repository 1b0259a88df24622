"""The Unix-socket HTTP client against hostile and broken servers.

Byte-level cases play the server on the other end of a `socketpair` (no threads, no sleeps);
cases that need a listening socket use the fake server.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.fake_server import FakeServer, Piece, Reply
from adapters.system import SystemClock
from adapters.uds_http._sync.exchange import HttpExchange as UdsExchange
from adapters.uds_http._sync.transport import UdsTransport, exchange_over
from app._sync.fetch import read_all
from client_support import refuse_unread
from domain.errors import ConnectError, InferError, ProtocolError, Stalled, StreamClosedEarly
from ports.transport import TIMED_OUT, ResponseHead

pytestmark = pytest.mark.timeout(30)

CLOCK = SystemClock()
HEADER_BYTES = 16384
OK_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@contextmanager
def served(
    raw: bytes = b"", *, eof: bool = True, method: str = "GET", body: bytes | None = None, header_bytes: int = 16384
) -> Iterator[tuple[UdsExchange, socket.socket]]:
    """An exchange whose server end has already sent `raw` (and EOF, if `eof`)."""
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    exchange = exchange_over(client, method, "/x", body, timeout=1.0, header_bytes=header_bytes)
    try:
        if raw:
            server.sendall(raw)
        if eof:
            server.shutdown(socket.SHUT_WR)
        yield exchange, server
    finally:
        exchange.close()
        server.close()


def response(raw: bytes, **kwargs: object) -> tuple[ResponseHead, bytes]:
    with served(raw, **kwargs) as (exchange, _):  # type: ignore[arg-type]
        head = exchange.head(1.0)
        assert isinstance(head, ResponseHead)
        return head, read_all(exchange, CLOCK, 1 << 20, 1.0)


def fails(raw: bytes, **kwargs: object) -> InferError:
    with pytest.raises(InferError) as caught:
        response(raw, **kwargs)
    return caught.value


def head_of(size: int) -> bytes:
    """A complete response head of exactly `size` bytes (Content-Length: 0)."""
    base = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Pad: \r\n\r\n"
    return base.replace(b"X-Pad: ", b"X-Pad: " + b"p" * (size - len(base)))


# -- the request ---------------------------------------------------------------------------------


def read_request(server: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or (b"Content-Length" in data and not data.endswith(b"}")):
        data += server.recv(65536)
    return data


def test_a_post_sends_method_path_host_type_length_close_and_the_exact_body() -> None:
    with served(eof=False, method="POST", body=b'{"a":1}') as (_, server):
        assert read_request(server) == (
            b"POST /x HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 7\r\nConnection: close\r\n\r\n{"a":1}'
        )


def test_a_get_without_body_sends_no_length_or_type() -> None:
    with served(eof=False) as (_, server):
        assert read_request(server) == b"GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(("method", "path"), [("GET", "/a b"), ("G ET", "/"), ("GET", "/\r\nX: 1")])
def test_a_malformed_request_is_a_value_error_before_connecting(method: str, path: str) -> None:
    with pytest.raises(ValueError, match="cannot send"):
        UdsTransport("/nonexistent/socket", header_bytes=HEADER_BYTES).open(method, path, timeout=1.0)


# -- the head ------------------------------------------------------------------------------------


def test_the_head_has_status_lowercased_names_and_values_as_sent() -> None:
    head, body = response(b"HTTP/1.1 503 Service Unavailable\r\nX-Thing:  a b \r\nContent-Length: 2\r\n\r\nno")
    assert head.status == 503
    assert head.headers == (("x-thing", "a b"), ("content-length", "2"))
    assert head.header("X-THING") == "a b"
    assert body == b"no"


def test_informational_responses_before_the_head_are_skipped() -> None:
    head, body = response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
    assert (head.status, body) == (200, b"x")


def test_a_head_of_exactly_16_kib_is_accepted() -> None:
    assert len(head_of(16384)) == 16384
    assert response(head_of(16384))[0].status == 200


def test_a_head_over_16_kib_in_one_read_is_a_protocol_error() -> None:
    error = fails(head_of(16385))
    assert isinstance(error, ProtocolError)
    assert "16385 bytes is over the 16384-byte limit" in str(error)


def test_an_unfinished_head_over_16_kib_is_a_protocol_error_without_waiting_for_its_end() -> None:
    raw = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 20000
    with served(raw, eof=False) as (exchange, _), pytest.raises(ProtocolError, match="over the 16384-byte limit"):
        exchange.head(1.0)


def test_the_header_limit_is_configurable() -> None:
    assert isinstance(fails(head_of(200), header_bytes=199), ProtocolError)
    assert response(head_of(200), header_bytes=200)[0].status == 200


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nx", "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n1\r\nx\r\n0\r\n\r\n",
            "both Transfer-Encoding and Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nx", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "Transfer-Encoding"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "Transfer-Encoding",
        ),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n", "malformed response head"),
        (b"HTTP/1.1 2\x0000 OK\r\nContent-Length: 0\r\n\r\n", "malformed response head"),
        (b"\x00\x00\x00\x00\r\n\r\n", "malformed response head"),
        (b"hello there\r\n\r\n", "malformed response head"),
        (b"HTTP/9.9 200 OK\r\n\r\n", "unsupported HTTP version '9.9'"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed response head"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed response head"),
        (OK_CHUNKED + b"zz\r\n", "malformed chunk size line"),
        (OK_CHUNKED + b"1" * 17 + b"\r\n", "17 hex digits"),
        (OK_CHUNKED + b"5\r\nhelloXX", "not followed by CRLF"),
    ],
)
def test_hostile_heads_and_framing_are_protocol_errors(raw: bytes, match: str) -> None:
    error = fails(raw)
    assert isinstance(error, ProtocolError), error
    assert match in str(error)


def test_chunk_extensions_and_trailers_are_accepted() -> None:
    raw = OK_CHUNKED + b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: yes\r\n\r\n"
    assert response(raw)[1] == b"hello"


def test_a_huge_chunk_size_that_the_server_never_fills_is_a_cut_stream() -> None:
    error = fails(OK_CHUNKED + b"ffffffffffffffff\r\nabc")
    assert isinstance(error, StreamClosedEarly)
    assert "inside chunk 1 after 3 of its 18446744073709551615 bytes" in str(error)


# -- EOF in every place --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"", "connection closed before any response byte"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "connection closed inside the response head after 27 bytes"),
        (OK_CHUNKED + b"5\r\nhel", "inside chunk 1 after 3 of its 5 bytes"),
        (OK_CHUNKED + b"5\r\nhello\r\n", "before the terminating zero-size chunk"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "content-length short, 3 of 10 bytes received"),
    ],
)
def test_eof_before_the_end_is_stream_closed_early_and_says_where(raw: bytes, where: str) -> None:
    error = fails(raw)
    assert isinstance(error, StreamClosedEarly)
    assert where in str(error)
    assert str(error).startswith("GET /x: ")


def test_a_body_without_length_or_chunking_is_read_until_close() -> None:
    assert response(b"HTTP/1.1 200 OK\r\n\r\nall of it\r\n0\r\n\r\n")[1] == b"all of it\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"),
        ("GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),
    ],
)
def test_responses_without_a_body_end_at_once(method: str, raw: bytes) -> None:
    with served(raw, eof=False, method=method) as (exchange, _):
        assert exchange.read(1.0) == b""


def test_a_reset_after_partial_data_is_stream_closed_early() -> None:
    # Linux resets a Unix socket whose peer closes with unread data: here, our request.
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    exchange = exchange_over(client, "POST", "/x", b"{}", timeout=1.0, header_bytes=HEADER_BYTES)
    server.sendall(OK_CHUNKED + b"5\r\nhel")
    server.close()
    with exchange:
        assert exchange.read(1.0) == b"hel"
        with pytest.raises(StreamClosedEarly, match="ECONNRESET"):
            exchange.read(1.0)


def test_a_connection_that_breaks_while_the_request_is_written_is_stream_closed_early(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    listener.close()  # the queued connection is dropped
    with pytest.raises(StreamClosedEarly, match="closed while the request was written"):
        exchange_over(client, "POST", "/x", b"x" * 1_000_000, timeout=1.0, header_bytes=HEADER_BYTES, peer=path)
    assert client.fileno() == -1


# -- timeouts ------------------------------------------------------------------------------------


def test_a_head_timeout_keeps_the_partial_head_and_the_head_completes_later() -> None:
    with served(b"HTTP/1.1 200 OK\r\nContent-", eof=False) as (exchange, server):
        assert exchange.head(0.02) is TIMED_OUT
        assert exchange.head(0.0) is TIMED_OUT
        server.sendall(b"Length: 2\r\n\r\nok")
        head = exchange.head(1.0)
        assert isinstance(head, ResponseHead) and head.status == 200
        assert exchange.head(0.0) is head
        assert exchange.read(0.0) == b"ok"
        assert exchange.read(0.0) == b""


def test_a_read_timeout_inside_a_chunk_header_leaves_the_exchange_usable() -> None:
    with served(OK_CHUNKED + b"1", eof=False) as (exchange, server):
        assert exchange.read(0.02) is TIMED_OUT
        server.sendall(b"0\r\n0123456789abcdef")
        assert exchange.read(0.5) == b"0123456789abcdef"
        assert exchange.read(0.01) is TIMED_OUT  # the timeout may change on every call
        server.sendall(b"\r\n0\r\n\r\n")
        assert exchange.read(5.0) == b""


def test_read_with_zero_or_negative_timeout_polls() -> None:
    with served(OK_CHUNKED + b"2\r\nab\r\n", eof=False) as (exchange, _):
        assert exchange.head(1.0) != TIMED_OUT
        assert exchange.read(-1.0) == b"ab"
        assert exchange.read(0.0) is TIMED_OUT
        assert exchange.read(-5.0) is TIMED_OUT


def test_read_all_that_runs_out_of_time_is_stalled() -> None:
    with served(OK_CHUNKED + b"2\r\nab\r\n", eof=False) as (exchange, _), pytest.raises(Stalled, match="2 bytes"):
        read_all(exchange, CLOCK, 100, 0.05)


def test_read_all_without_a_head_in_time_is_stalled() -> None:
    with served(eof=False) as (exchange, _), pytest.raises(Stalled, match="no response head"):
        read_all(exchange, CLOCK, 100, 0.02)


# -- size limits on whole bodies -----------------------------------------------------------------


def test_read_all_refuses_a_content_length_over_the_limit_before_reading() -> None:
    # nothing but the head is sent: the limit is applied to the promise, not to bytes read
    message = "Content-Length 4194305 is over the 4194304-byte body limit"
    with (
        served(b"HTTP/1.1 200 OK\r\nContent-Length: 4194305\r\n\r\n", eof=False) as (exchange, _),
        pytest.raises(ProtocolError, match=message),
    ):
        read_all(exchange, CLOCK, 4 * 1024 * 1024, 1.0)


@pytest.mark.parametrize("chunked", [True, False])
def test_a_body_of_4_mib_plus_one_byte_is_a_protocol_error(chunked: bool) -> None:
    big = b"x" * (4 * 1024 * 1024 + 1)
    headers = [] if chunked else [("Content-Length", str(len(big)))]
    pieces = [Piece(0, big[i : i + 65536]) for i in range(0, len(big), 65536)]
    with FakeServer({("GET", "/big"): Reply(200, headers, pieces, chunked=chunked)}) as server:
        exchange = UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("GET", "/big", timeout=1.0)
        with exchange, pytest.raises(ProtocolError, match="over the 4194304-byte"):
            read_all(exchange, CLOCK, 4 * 1024 * 1024, 5.0)


def test_a_body_of_exactly_the_limit_is_read_whole() -> None:
    with served(OK_CHUNKED + b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n") as (exchange, _):
        assert read_all(exchange, CLOCK, 8, 1.0) == b"helloabc"


# -- close ---------------------------------------------------------------------------------------


def test_close_is_idempotent_and_reads_after_it_are_stream_closed_early() -> None:
    with served(OK_CHUNKED + b"2\r\nab\r\n", eof=False) as (exchange, _):
        assert exchange.read(1.0) == b"ab"
        exchange.close()
        exchange.close()
        with pytest.raises(StreamClosedEarly, match="already closed"):
            exchange.read(0.1)
        assert exchange.head(0.1) is not TIMED_OUT  # the head stays known


def test_head_after_close_before_the_head_is_stream_closed_early() -> None:
    with served(eof=False) as (exchange, _):
        exchange.close()
        with pytest.raises(StreamClosedEarly):
            exchange.head(0.1)
        with pytest.raises(StreamClosedEarly):
            exchange.read(0.1)


def test_a_refused_head_stays_refused() -> None:
    with served(head_of(16385)) as (exchange, _):
        for _ in range(2):
            with pytest.raises(ProtocolError):
                exchange.read(0.1)


def test_a_failed_exchange_keeps_failing() -> None:
    with served(OK_CHUNKED + b"zz\r\n") as (exchange, _):
        for _ in range(2):
            with pytest.raises(ProtocolError):
                exchange.read(0.1)


# -- connecting ----------------------------------------------------------------------------------


def test_a_missing_socket_is_a_connect_error_naming_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.sock")
    with pytest.raises(ConnectError, match=f"cannot connect to {path}: no such socket file") as caught:
        UdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/slots", timeout=1.0)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_a_socket_nobody_listens_on_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "dead.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # bound, never listening: what a crashed server leaves behind
    try:
        with pytest.raises(ConnectError, match=f"{path}: connection refused"):
            UdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/slots", timeout=1.0)
    finally:
        stale.close()


def test_a_path_too_long_for_a_unix_socket_is_a_connect_error(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match="cannot connect to"):
        UdsTransport(str(tmp_path / ("x" * 200)), header_bytes=HEADER_BYTES).open("GET", "/", timeout=1.0)


def connect_as_nobody(path: str) -> str:
    """Try to connect from a forked child running as an unprivileged user; returns the error."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        message = "connected"
        try:
            os.setgid(65534)
            os.setuid(65534)
            UdsTransport(path, header_bytes=HEADER_BYTES).open("GET", "/", timeout=1.0).close()
        except ConnectError as exc:
            message = str(exc)
        except BaseException as exc:
            message = repr(exc)
        finally:
            os.write(write_end, message.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def test_a_socket_we_may_not_use_is_permission_denied() -> None:
    with FakeServer() as server:
        os.chmod(os.path.dirname(server.socket_path), 0o755)
        os.chmod(server.socket_path, 0o600)
        if os.geteuid() == 0:  # root ignores file modes: ask as an unprivileged user
            message = connect_as_nobody(server.socket_path)
        else:
            os.chmod(server.socket_path, 0o000)
            with pytest.raises(ConnectError) as caught:
                UdsTransport(server.socket_path, header_bytes=HEADER_BYTES).open("GET", "/", timeout=1.0)
            message = str(caught.value)
    assert message == f"cannot connect to {server.socket_path}: permission denied"


# -- fuzz: any bytes from the server end in data or one of two errors ----------------------------

RESPONSE_ALPHABET = st.sampled_from(
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.0 404 x\r\n",
        b"Content-Length: 3\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"\r\n",
        b"3\r\nabc\r\n",
        b"0\r\n\r\n",
        b"X: y\r\n",
        b":",
        b" ",
        b"\x00",
        b"\xff",
        b"a",
        b"1",
        b"\n",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=100), st.lists(RESPONSE_ALPHABET, max_size=20).map(b"".join)))
def test_any_bytes_from_the_server_give_data_or_a_protocol_error_or_a_cut(data: bytes) -> None:
    with suppress(ProtocolError, StreamClosedEarly):
        response(data)


def test_a_server_feeding_bytes_slowly_is_read_in_order() -> None:
    raw = OK_CHUNKED + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    exchange = exchange_over(client, "GET", "/x", timeout=1.0, header_bytes=HEADER_BYTES)

    def trickle() -> None:
        for i in range(len(raw)):
            server.sendall(raw[i : i + 1])
        server.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        assert read_all(exchange, CLOCK, 100, 5.0) == b"hello world"
    finally:
        writer.join()
        exchange.close()
        server.close()


def test_an_answer_sent_before_the_server_broke_off_the_request_is_the_answer() -> None:
    # A server that refuses a body too large answers 413 and closes without reading the rest:
    # the write then fails (EPIPE), and the answer, already received, is what the exchange reads.
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    refuser = threading.Thread(target=refuse_unread, args=(server,))
    refuser.start()
    exchange = exchange_over(client, "POST", "/x", b"x" * (8 << 20), timeout=2.0, header_bytes=HEADER_BYTES)
    refuser.join(2.0)
    try:
        head = exchange.head(1.0)
        assert isinstance(head, ResponseHead)
        assert head.status == 413
        assert read_all(exchange, CLOCK, 1 << 20, 1.0) == b"too big"
    finally:
        exchange.close()


def test_an_answer_sent_by_a_server_that_then_stops_reading_is_the_answer_not_a_write_stall() -> None:
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    release = threading.Event()

    def refuse_and_hold() -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += server.recv(65536)
        server.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 7\r\n\r\ntoo big")
        release.wait(5.0)  # the connection held open, nothing more read
        server.close()

    holder = threading.Thread(target=refuse_and_hold)
    holder.start()
    try:
        exchange = exchange_over(client, "POST", "/x", b"x" * (8 << 20), timeout=0.1, header_bytes=HEADER_BYTES)
        head = exchange.head(1.0)
        assert isinstance(head, ResponseHead)
        assert head.status == 413
        exchange.close()
    finally:
        release.set()
        holder.join(2.0)


def test_a_request_broken_off_with_no_answer_is_still_the_write_failure() -> None:
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def hang_up() -> None:
        server.recv(65536)
        server.close()

    hanger = threading.Thread(target=hang_up)
    hanger.start()
    with pytest.raises(StreamClosedEarly, match="closed while the request was written"):
        exchange_over(client, "POST", "/x", b"x" * (8 << 20), timeout=2.0, header_bytes=HEADER_BYTES)
    hanger.join(2.0)
