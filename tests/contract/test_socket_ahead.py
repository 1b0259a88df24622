"""The socket made ahead (`SocketAhead`), in both transports: a request written makes the socket
of the next connect, so that connect makes none of its own; nothing at the other end sees it (no
connection until it is taken); a socket made in another process (before a fork) is closed, never
taken; a failure to make one is left to the connect, which says why; closing is idempotent."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_mock import MockerFixture

import adapters.uds_http.sockets as sockets
from adapters.uds_http._async.transport import AsyncUdsTransport
from adapters.uds_http._sync.transport import UdsTransport
from adapters.uds_http.sockets import SocketAhead
from domain.errors import ConnectError

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    server.settimeout(0.0)
    try:
        yield path, server
    finally:
        server.close()


def accepted(server: socket.socket) -> int:
    """How many connections wait to be accepted (each accepted and closed)."""
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


Made = list[socket.socket]


@pytest.fixture
def made(mocker: MockerFixture) -> Made:
    """Every socket the connects made themselves (not taken from ahead)."""
    sockets_made: Made = []
    real = sockets.unix_socket

    def counting(path: str) -> socket.socket:
        sock = real(path)
        sockets_made.append(sock)
        return sock

    mocker.patch.object(sockets, "unix_socket", counting)
    return sockets_made


def sync_requests(path: str, count: int) -> bool:
    """`count` requests through one blocking transport; whether a socket waits ahead after."""
    transport = UdsTransport(path, header_bytes=16384)
    for _ in range(count):
        transport.open("GET", "/health", None, timeout=1.0).close()
    return bool(transport._ahead._ready)


def async_requests(path: str, count: int) -> bool:
    async def scene() -> bool:
        transport = AsyncUdsTransport(path, header_bytes=16384)
        for _ in range(count):
            (await transport.open("GET", "/health", None, timeout=1.0)).close()
        return bool(transport._ahead._ready)

    return asyncio.run(scene())


FLAVOURS: dict[str, Callable[[str, int], bool]] = {"blocking": sync_requests, "asyncio": async_requests}


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_after_the_first_request_each_connect_takes_the_socket_made_ahead(
    listener: tuple[str, socket.socket], made: Made, flavour: str
) -> None:
    path, server = listener
    waiting = FLAVOURS[flavour](path, 4)
    assert len(made) == 1  # the first request's connect made its own; the next three took one each
    assert waiting  # and the last request made the next one
    assert accepted(server) == 4  # one connection per request: the socket waiting ahead is not connected


def test_the_socket_made_ahead_is_non_blocking_already_so_its_connect_sets_nothing(
    listener: tuple[str, socket.socket], mocker: MockerFixture
) -> None:
    path, _ = listener
    ahead = SocketAhead()
    ahead.refill()
    [(_, waiting)] = ahead._ready
    assert waiting.getblocking() is False
    set_blocking = mocker.spy(socket.socket, "setblocking")

    stream = sockets.SocketStream.connect(path, 1.0, None, ahead)

    assert set_blocking.call_count == 0
    stream.close()


def test_a_transport_made_makes_no_socket_before_its_first_request(listener: tuple[str, socket.socket]) -> None:
    path, server = listener
    transport = UdsTransport(path, header_bytes=16384)
    assert transport._ahead._ready == []
    assert accepted(server) == 0


def test_a_socket_made_ahead_in_another_process_is_closed_not_taken(mocker: MockerFixture) -> None:
    ahead = SocketAhead()
    ahead.refill()
    [(_, waiting)] = ahead._ready
    mocker.patch.object(sockets.os, "getpid", return_value=os.getpid() + 1)  # as in a forked child
    assert ahead.take() is None
    assert waiting.fileno() == -1  # closed in this process
    ahead.refill()
    mine = ahead.take()  # made by this (the child) process: taken
    assert mine is not None
    mine.close()


def test_a_connect_in_a_forked_child_makes_its_own_socket(
    listener: tuple[str, socket.socket], made: Made, mocker: MockerFixture
) -> None:
    path, server = listener
    transport = UdsTransport(path, header_bytes=16384)
    transport.open("GET", "/health", None, timeout=1.0).close()
    mocker.patch.object(sockets.os, "getpid", return_value=os.getpid() + 1)
    transport.connect(1.0).close()
    assert len(made) == 2
    assert accepted(server) == 2


def test_a_socket_that_cannot_be_made_ahead_leaves_the_connect_to_say_why(
    listener: tuple[str, socket.socket], mocker: MockerFixture
) -> None:
    path, _ = listener
    transport = UdsTransport(path, header_bytes=16384)
    mocker.patch.object(sockets.socket, "socket", side_effect=OSError(24, "Too many open files"))
    transport._ahead.refill()  # no raise: nothing made
    assert transport._ahead._ready == []
    with pytest.raises(ConnectError, match=f"cannot connect to {path}: no socket.*Too many open files"):
        transport.connect(1.0)


def test_two_threads_taking_at_once_never_share_the_socket() -> None:
    ahead = SocketAhead()
    ahead.refill()
    taken: list[socket.socket | None] = []
    start = threading.Barrier(8)

    def take() -> None:
        start.wait()
        taken.append(ahead.take())

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = [sock for sock in taken if sock is not None]
    assert len(got) == 1
    got[0].close()


def test_close_closes_the_socket_waiting_and_is_idempotent() -> None:
    ahead = SocketAhead()
    ahead.refill()
    [(_, waiting)] = ahead._ready
    ahead.close()
    ahead.close()
    assert waiting.fileno() == -1
    assert ahead.take() is None


@pytest.mark.parametrize("transport_type", [UdsTransport, AsyncUdsTransport])
def test_a_transport_dropped_in_a_reference_cycle_closes_its_socket_without_a_resource_warning(
    transport_type: type[UdsTransport] | type[AsyncUdsTransport],
) -> None:
    # A Container holds its transport in a cycle: the socket made ahead and its holder are then
    # garbage together, and the socket must be closed before its own finalizer finds it open.
    transport = transport_type("/tmp/nowhere.sock", header_bytes=16384)
    gc.collect(0)  # the transport, and what it holds, now in an older generation than what comes
    transport._ahead.refill()  # as every request written does: the socket made ahead, young
    waiting = transport._ahead._ready[0][1]
    cycle: list[object] = [transport]
    cycle.append(cycle)
    del transport, cycle
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert waiting.fileno() == -1


def test_a_refill_after_close_makes_nothing_and_one_racing_a_close_leaves_nothing(mocker: MockerFixture) -> None:
    ahead = SocketAhead()
    ahead.close()
    ahead.refill()
    assert ahead.take() is None
    # A request written while the client closes: the refill makes its socket as close() runs.
    racing = SocketAhead()
    made: list[socket.socket] = []
    real = socket.socket

    def socket_then_close(*args: Any) -> socket.socket:
        sock = real(*args)
        made.append(sock)
        racing.close()  # the close lands between the socket made and its being kept
        return sock

    mocker.patch.object(sockets.socket, "socket", socket_then_close)
    racing.refill()
    assert racing.take() is None
    assert [sock.fileno() for sock in made] == [-1]
