"""Forwarding through the proxy: exact bytes both ways, half-closes, and every way upstream fails.

The proxy runs in-process on its own thread; the upstream is a scripted TCP server on loopback.
"""

import hashlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters.proxy.options import Address
from adapters.proxy.pump import Mover, copy_bytes, splice_bytes
from adapters.proxy.testing import LoopbackUpstream, black_hole, echo, reset, running_proxy, unused_port

MOVERS = [pytest.param(splice_bytes, id="splice"), pytest.param(copy_bytes, id="copy")]
MiB = 1024 * 1024


def read_to_end(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while chunk := sock.recv(MiB):
        chunks.append(chunk)
    return b"".join(chunks)


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[int, str]:
    """Read until EOF or a reset; return the byte count and how it ended."""
    sock.settimeout(timeout)
    total = 0
    try:
        while chunk := sock.recv(MiB):
            total += len(chunk)
    except ConnectionResetError:
        return total, "reset"
    return total, "eof"


def piece_sizes(total: int, rng: random.Random) -> Iterator[int]:
    """Sizes from 1 byte to 1 MiB, spread evenly on a log scale, adding up to `total`."""
    left = total
    while left:
        size = min(left, int(2 ** rng.uniform(0, 20)))
        left -= size
        yield size


@contextmanager
def sending(sock: socket.socket, data: bytes, rng: random.Random) -> Iterator[None]:
    """Send `data` in pieces of random sizes on a thread, then half-close; joined on exit."""
    failures: list[BaseException] = []

    def send() -> None:
        try:
            view = memoryview(data)
            offset = 0
            for size in piece_sizes(len(data), rng):
                sock.sendall(view[offset : offset + size])
                offset += size
            sock.shutdown(socket.SHUT_WR)
        except BaseException as exc:
            failures.append(exc)

    sender = threading.Thread(target=send, name="test-sender")
    sender.start()
    try:
        yield
    finally:
        sender.join(30)
    assert not sender.is_alive()
    assert not failures, failures


def recording_echo(heard: list[tuple[int, str]]) -> Callable[[socket.socket], None]:
    """Echo everything back and record the size and SHA-256 of what arrived upstream."""

    def handler(conn: socket.socket) -> None:
        digest = hashlib.sha256()
        size = 0
        buf = bytearray(256 * 1024)
        while n := conn.recv_into(buf):
            digest.update(memoryview(buf)[:n])
            size += n
            conn.sendall(memoryview(buf)[:n])
        conn.shutdown(socket.SHUT_WR)
        heard.append((size, digest.hexdigest()))

    return handler


@pytest.mark.parametrize("mover", MOVERS)
@pytest.mark.parametrize("size", [0, 1, 200, 8191, 65537, MiB + 3, 16 * MiB])
def test_bytes_arrive_exactly_both_ways_in_pieces_of_every_size(tmp_path: Path, size: int, mover: Mover) -> None:
    rng = random.Random(size)
    payload = rng.randbytes(size)
    heard: list[tuple[int, str]] = []
    with (
        LoopbackUpstream(recording_echo(heard)) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, mover=mover) as proxy,
        proxy.connect() as client,
    ):
        with sending(client, payload, rng):
            digest = hashlib.sha256()
            received = 0
            client.settimeout(10)
            while chunk := client.recv(MiB):
                digest.update(chunk)
                received += len(chunk)
        upstream.join_handlers(5)
    expected = hashlib.sha256(payload).hexdigest()
    assert heard == [(size, expected)]  # client -> upstream, exact
    assert (received, digest.hexdigest()) == (size, expected)  # and back, exact
    assert not upstream.failures


def test_a_client_that_half_closes_after_its_request_gets_a_slow_long_answer_to_the_end(tmp_path: Path) -> None:
    # 12 pieces 50 ms apart: 600 ms of answer after the client's EOF, longer than socat's default
    # 0.5 s cut-off. The proxy has no such timer at all.
    pieces = [random.Random(i).randbytes(64 * 1024) for i in range(12)]
    requests: list[bytes] = []
    stop = threading.Event()

    def slow_answer(conn: socket.socket) -> None:
        requests.append(read_to_end(conn))  # returns only because the half-close came through
        for piece in pieces:
            if stop.wait(0.05):
                return
            conn.sendall(piece)
        conn.shutdown(socket.SHUT_WR)

    with (
        LoopbackUpstream(slow_answer) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
        proxy.connect() as client,
    ):
        try:
            client.sendall(b"POST /v1/chat/completions")
            client.shutdown(socket.SHUT_WR)
            started = time.monotonic()
            answer = read_to_end(client, timeout=5)
            elapsed = time.monotonic() - started
        finally:
            stop.set()
    assert requests == [b"POST /v1/chat/completions"]
    assert answer == b"".join(pieces)
    assert elapsed >= 0.55
    assert not upstream.failures


def test_an_upstream_that_half_closes_first_still_hears_the_client_to_the_end(tmp_path: Path) -> None:
    heard: list[bytes] = []

    def greet_then_listen(conn: socket.socket) -> None:
        conn.sendall(b"greeting")
        conn.shutdown(socket.SHUT_WR)
        heard.append(read_to_end(conn))

    late_words = random.Random(7).randbytes(2 * MiB)
    with (
        LoopbackUpstream(greet_then_listen) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
        proxy.connect() as client,
    ):
        assert read_to_end(client, timeout=5) == b"greeting"
        client.sendall(late_words)  # the way up is still open after the upstream's EOF
        client.shutdown(socket.SHUT_WR)
        upstream.join_handlers(5)
        assert proxy.proxy.wait_idle(2)
    assert heard == [late_words]
    assert not upstream.failures


def test_an_upstream_that_refuses_gets_the_client_closed_at_once_and_one_line(tmp_path: Path) -> None:
    address = unused_port()
    with running_proxy(str(tmp_path / "p.sock"), address) as proxy, proxy.connect() as client:
        started = time.monotonic()
        assert read_until_closed(client, timeout=2) == (0, "eof")
        assert time.monotonic() - started < 0.5
        assert proxy.proxy.wait_idle(2)
    assert proxy.lines == [f"closed a connection: upstream {address} unreachable (Connection refused)"]


def test_a_client_waits_for_an_upstream_that_never_answers_no_longer_than_the_connect_timeout(tmp_path: Path) -> None:
    # The spare is connecting ahead when the client comes: the client waits for that attempt,
    # and its own first try gets only what is left of the one connect timeout, not another.
    with (
        black_hole() as address,
        running_proxy(str(tmp_path / "p.sock"), address, connect_timeout=0.2, ready_every=60.0) as proxy,
        proxy.connect() as client,
    ):
        started = time.monotonic()
        assert read_until_closed(client, timeout=2) == (0, "eof")
        elapsed = time.monotonic() - started
        assert proxy.proxy.wait_idle(2)
    assert 0.1 <= elapsed < 0.3  # two timeouts would be 0.4 s
    assert proxy.lines == [f"closed a connection: upstream {address} unreachable (timed out)"]


def test_an_upstream_name_that_cannot_be_looked_up_gets_the_client_closed_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command line refuses such a name; a proxy made in code with one fails each connect as
    # an unreachable upstream would, not with a traceback from its threads.
    crashed: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    address = Address("a..b", 80)
    with running_proxy(str(tmp_path / "p.sock"), address, ready_every=60.0) as proxy, proxy.connect() as client:
        assert read_until_closed(client, timeout=2) == (0, "eof")
        assert proxy.proxy.wait_idle(2)
    assert crashed == []
    assert proxy.lines == [
        f"closed a connection: upstream {address} unreachable ('a..b' is not a host name "
        "(encoding with 'idna' codec failed (UnicodeError: label empty or too long)))"
    ]


def test_an_upstream_that_never_answers_the_connect_times_out_and_closes_the_client(tmp_path: Path) -> None:
    with (
        black_hole() as address,
        running_proxy(str(tmp_path / "p.sock"), address, connect_timeout=0.1) as proxy,
        proxy.connect() as client,
    ):
        started = time.monotonic()
        assert read_until_closed(client, timeout=2) == (0, "eof")
        elapsed = time.monotonic() - started
        assert proxy.proxy.wait_idle(2)
    assert 0.08 <= elapsed < 1.0
    assert proxy.lines == [f"closed a connection: upstream {address} unreachable (timed out)"]


def test_an_upstream_that_resets_mid_stream_ends_the_clients_connection(tmp_path: Path) -> None:
    def answer_then_reset(conn: socket.socket) -> None:
        conn.recv(100)
        conn.sendall(b"x" * 65536)
        reset(conn)

    with (
        LoopbackUpstream(answer_then_reset) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
        proxy.connect() as client,
    ):
        client.sendall(b"request")
        received, _how = read_until_closed(client, timeout=2)
        assert received <= 65536
        assert proxy.proxy.wait_idle(2)
        # The way up is shut too: the client cannot go on talking into a dead connection.
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(100):
                client.sendall(b"more" * 1024)
    assert not upstream.failures
    assert proxy.lines == []


def test_a_silent_upstream_is_waited_for_without_a_timer_and_freed_when_the_client_leaves(tmp_path: Path) -> None:
    seen: list[bytes] = []

    def silent(conn: socket.socket) -> None:
        seen.append(conn.recv(100))
        seen.append(read_to_end(conn))  # b"" once the proxy closes its side

    with (
        LoopbackUpstream(silent) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
    ):
        client = proxy.connect()
        try:
            client.sendall(b"request")
            client.settimeout(0.2)
            with pytest.raises(TimeoutError):
                client.recv(1)  # nothing arrives, and the proxy does not cut the connection
            assert proxy.proxy.open_connections == 1
        finally:
            client.close()
        assert proxy.proxy.wait_idle(2)
        upstream.join_handlers(2)
    assert seen == [b"request", b""]
    assert not upstream.failures


def test_a_client_that_half_closes_then_leaves_while_upstream_is_silent_frees_its_slot(tmp_path: Path) -> None:
    release = threading.Event()

    def silent(conn: socket.socket) -> None:
        read_to_end(conn)
        release.wait(5)

    with (
        LoopbackUpstream(silent) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
    ):
        try:
            client = proxy.connect()
            client.sendall(b"request")
            client.shutdown(socket.SHUT_WR)
            client.settimeout(0.1)
            with pytest.raises(TimeoutError):
                client.recv(1)  # half-closed, still waiting for the answer
            assert proxy.proxy.open_connections == 1
            client.close()
            assert proxy.proxy.wait_idle(2)
        finally:
            release.set()


def test_a_client_that_goes_away_mid_stream_closes_the_upstream_connection(tmp_path: Path) -> None:
    ended: list[str] = []

    def endless(conn: socket.socket) -> None:
        conn.recv(100)
        block = b"data: token\n\n" * 1000
        try:
            while True:
                conn.sendall(block)
        except (BrokenPipeError, ConnectionResetError) as exc:
            ended.append(type(exc).__name__)

    with (
        LoopbackUpstream(endless) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
    ):
        with proxy.connect() as client:
            client.sendall(b"request")
            client.settimeout(2)
            assert client.recv(100)
        assert proxy.proxy.wait_idle(2)
        upstream.join_handlers(2)
    assert len(ended) == 1
    assert not upstream.failures


def test_each_connection_gets_its_own_upstream_connection(tmp_path: Path) -> None:
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address) as proxy,
    ):
        clients = [proxy.connect() for _ in range(3)]
        try:
            for i, client in enumerate(clients):
                client.sendall(f"client {i}".encode())
            for i, client in enumerate(clients):
                client.settimeout(2)
                assert client.recv(100) == f"client {i}".encode()
        finally:
            for client in clients:
                client.close()
        assert proxy.proxy.wait_idle(2)
        assert upstream.accepted == 3
