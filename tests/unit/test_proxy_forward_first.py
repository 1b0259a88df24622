"""`Connection.forward_first` (and its second look at `wake`) and the check of the connection made
ahead, on socket pairs: what the client has sent goes up at once, what the upstream socket does
not take at once is kept for the first thread, and a connection the upstream closed (or that
talks unasked) is never used."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest

from adapters.proxy.connection import FIRST_READ, Connection
from adapters.proxy.options import Address
from adapters.proxy.pump import copy_bytes


def connection() -> Connection:
    return Connection(
        Address("127.0.0.1", 9),
        name="test",
        connect_timeout=1.0,
        first_byte_timeout=1.0,
        mover=copy_bytes,
        on_closed=lambda _line: None,
        on_finished=lambda _c: None,
    )


def made_ahead(conn: Connection, ready: socket.socket) -> None:
    """What `_keep_ready` publishes: the connection and a poll of it alone."""
    conn._ready = ready
    conn._ready_check = select.poll()
    conn._ready_check.register(ready, select.POLLIN)
    conn._first = bytearray(FIRST_READ)


Pairs = tuple[socket.socket, socket.socket, socket.socket, socket.socket]


@pytest.fixture
def pairs() -> Iterator[Pairs]:
    """(client's end, proxy's client end, proxy's upstream end, upstream's end)."""
    client, accepted = socket.socketpair()
    up, server = socket.socketpair()
    yield client, accepted, up, server
    for sock in (client, accepted, up, server):
        sock.close()


def test_what_the_client_sent_goes_up_the_ready_connection_at_once(pairs: Pairs) -> None:
    client, accepted, up, server = pairs
    conn = connection()
    made_ahead(conn, up)
    client.sendall(b"POST / HTTP/1.1\r\n\r\n")
    assert conn.take(accepted, 0.0)
    conn.forward_first()
    server.settimeout(1)
    assert server.recv(100) == b"POST / HTTP/1.1\r\n\r\n"
    assert conn._linked is up and conn._moved and conn._pending == b""


def test_with_nothing_sent_yet_the_connection_is_linked_and_the_first_byte_still_awaited(pairs: Pairs) -> None:
    _client, accepted, up, _server = pairs
    conn = connection()
    made_ahead(conn, up)
    assert conn.take(accepted, 0.0)
    conn.forward_first()
    assert conn._linked is up and not conn._moved


def test_what_the_upstream_socket_does_not_take_at_once_is_kept_for_the_first_thread(pairs: Pairs) -> None:
    client, accepted, up, server = pairs
    up.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    payload = bytes(range(256)) * (FIRST_READ // 256)
    client.setblocking(False)
    sent = client.send(payload)
    conn = connection()
    made_ahead(conn, up)
    assert conn.take(accepted, 0.0)
    conn.forward_first()
    server.setblocking(False)
    got = b""
    while True:
        try:
            got += server.recv(1 << 20)
        except BlockingIOError:
            break
    assert 0 < len(got) < sent
    assert got + conn._pending == payload[:sent]  # in order, nothing lost, nothing twice
    assert conn._moved


@pytest.mark.parametrize("how", ["closed", "talking"])
def test_a_ready_connection_the_upstream_closed_or_that_talks_unasked_is_not_used(pairs: Pairs, how: str) -> None:
    client, accepted, up, server = pairs
    if how == "closed":
        server.close()
    else:
        server.sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    conn = connection()
    made_ahead(conn, up)
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert conn.take(accepted, 0.0)
    conn.forward_first()
    assert conn._linked is None and conn._upstream is None and conn._ready is None
    assert up.fileno() == -1  # closed by the check
    assert not conn._moved  # the request is still in the client's socket, for a new connection
    accepted.settimeout(1)
    assert accepted.recv(100) == b"GET / HTTP/1.1\r\n\r\n"


def test_a_ready_connection_that_fails_at_the_send_hands_the_bytes_to_the_first_thread(pairs: Pairs) -> None:
    # Dropped between the check and the send: the check (a poll of another, idle socket here)
    # passes, the send fails; the bytes read from the client are kept, the connection let go.
    client, accepted, up, server = pairs
    idle_a, idle_b = socket.socketpair()
    try:
        conn = connection()
        made_ahead(conn, up)
        conn._ready_check = select.poll()
        conn._ready_check.register(idle_a, select.POLLIN)
        server.close()
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert conn.take(accepted, 0.0)
        conn.forward_first()
        assert conn._pending == b"GET / HTTP/1.1\r\n\r\n" and conn._moved
        assert conn._linked is None and conn._upstream is None
        assert up.fileno() == -1
    finally:
        idle_a.close()
        idle_b.close()


def test_a_request_that_comes_after_forward_first_goes_up_at_wake_and_wakes_no_thread(pairs: Pairs) -> None:
    client, accepted, up, server = pairs
    conn = connection()
    made_ahead(conn, up)
    conn._watch = select.epoll()  # what `start` makes: the first thread's wait while its client is quiet
    try:
        assert conn.take(accepted, 0.0)
        conn.forward_first()
        assert not conn._moved  # nothing had come yet
        client.sendall(b"POST / HTTP/1.1\r\n\r\n")
        conn.wake()
        server.settimeout(1)
        assert server.recv(100) == b"POST / HTTP/1.1\r\n\r\n"
        assert conn._lazy and not conn._taken.is_set()
    finally:
        conn._watch.close()


def test_a_request_that_cannot_go_up_at_wake_is_pending_for_the_first_thread(pairs: Pairs) -> None:
    client, accepted, up, server = pairs
    conn = connection()
    made_ahead(conn, up)
    conn._watch = select.epoll()
    try:
        assert conn.take(accepted, 0.0)
        conn.forward_first()
        server.close()  # the upstream drops the connection now: the write at wake fails
        client.sendall(b"POST / HTTP/1.1\r\n\r\n")
        conn.wake()
        assert conn._pending == b"POST / HTTP/1.1\r\n\r\n"
        assert conn._taken.is_set() and not conn._lazy
    finally:
        conn._watch.close()
