"""`send_now`, the first write of every request, in both socket streams: it sends what the
socket's buffer takes at once and never waits, whatever timeout the stream last had (a blocking
socket's timeout would make `send` poll first), and a broken connection is an `OSError`."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from adapters.uds_http.sockets import AsyncSocketStream, SocketStream

pytestmark = pytest.mark.timeout(10)

REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}"
# Each stream's `send_now`, called from where it runs: the blocking one as it is, the asyncio
# one inside a running loop (where it is made), with the stream's last timeout set first.
Sender = Callable[[socket.socket, bytes], int]
TIMEOUTS = [None, 0.0, 5.0]  # never set, polling, positive (the descriptor non-blocking)


def sync_sender(timeout: float | None) -> Sender:
    def send(sock: socket.socket, data: bytes) -> int:
        stream = SocketStream(sock)
        if timeout is not None:
            stream._settimeout(timeout)
        return stream.send_now(data)

    return send


def async_send(sock: socket.socket, data: bytes) -> int:
    async def scene() -> int:
        return AsyncSocketStream(sock).send_now(data)

    return asyncio.run(scene())


SENDERS = {**{f"sync, timeout {t}": sync_sender(t) for t in TIMEOUTS}, "asyncio": async_send}


@pytest.fixture(params=list(SENDERS))
def send_now(request: pytest.FixtureRequest) -> Sender:
    return SENDERS[request.param]


@contextmanager
def small_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        yield ours, peer
    finally:
        ours.close()
        peer.close()


def fill(sock: socket.socket) -> None:
    """Write until the socket's buffers take nothing more."""
    sock.setblocking(False)
    try:
        while True:
            sock.send(b"x" * 65536)
    except BlockingIOError:
        pass
    sock.setblocking(True)


def drain(peer: socket.socket, size: int) -> bytes:
    got = b""
    peer.settimeout(2.0)
    while len(got) < size:
        piece = peer.recv(size - len(got))
        assert piece, "EOF before every byte sent"
        got += piece
    return got


def test_a_request_goes_whole_at_once(send_now: Sender) -> None:
    with small_pair() as (ours, peer):
        assert send_now(ours, REQUEST) == len(REQUEST)
        assert drain(peer, len(REQUEST)) == REQUEST


def test_a_full_buffer_takes_nothing_and_the_write_does_not_wait(send_now: Sender) -> None:
    with small_pair() as (ours, _peer):
        fill(ours)
        started = time.monotonic()
        assert send_now(ours, REQUEST) == 0
        assert time.monotonic() - started < 0.5  # a positive timeout would be 5 s


def test_more_than_the_buffer_holds_goes_in_part_and_the_part_is_the_first_bytes(send_now: Sender) -> None:
    data = bytes(range(256)) * 1024  # 256 KiB, many times the small buffers
    with small_pair() as (ours, peer):
        sent = send_now(ours, data)
        assert 0 < sent < len(data)
        assert drain(peer, sent) == data[:sent]


def test_a_connection_the_peer_closed_is_an_os_error(send_now: Sender) -> None:
    with small_pair() as (ours, peer):
        peer.close()
        with pytest.raises(OSError):
            send_now(ours, REQUEST)
