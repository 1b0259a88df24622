"""A connect to a Unix socket whose accept backlog is full waits for a place, in both flavours,
within the same limit: many calls started at once against a slow acceptor get connected, not
refused. A backlog that stays full is a `ConnectError` at the limit, and a cancel (the token in
the blocking flavour, the task's in asyncio) ends the wait at once."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.uds_http.sockets import AsyncSocketStream, SocketStream
from backlog import full_backlog as filled
from domain.cancel import CancelToken
from domain.errors import ConnectError

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def full_backlog(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A listening socket that accepts nothing, with its backlog filled by idle clients."""
    path = str(tmp_path / "full.sock")
    listener, fillers = filled(path)
    try:
        yield path, listener
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_connect_waits_for_a_place_in_a_full_backlog(full_backlog: tuple[str, socket.socket]) -> None:
    path, listener = full_backlog

    async def scene() -> float:
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: listener.accept()[0].close())  # a place frees after 100 ms
        started = time.monotonic()
        stream = await AsyncSocketStream.connect(path, 2.0)
        stream.close()
        return time.monotonic() - started

    waited = asyncio.run(scene())
    assert 0.09 <= waited < 1.0


def test_a_backlog_that_stays_full_is_a_connect_error_at_the_limit(full_backlog: tuple[str, socket.socket]) -> None:
    path, _ = full_backlog

    async def scene() -> float:
        started = time.monotonic()
        with pytest.raises(ConnectError, match="accept backlog is full"):
            await AsyncSocketStream.connect(path, 0.15)
        return time.monotonic() - started

    assert 0.14 <= asyncio.run(scene()) < 0.6


def test_a_blocking_connect_waits_for_a_place_in_a_full_backlog(full_backlog: tuple[str, socket.socket]) -> None:
    path, listener = full_backlog
    timer = threading.Timer(0.1, lambda: listener.accept()[0].close())  # a place frees after 100 ms
    timer.start()
    started = time.monotonic()
    try:
        SocketStream.connect(path, 2.0).close()
    finally:
        timer.join()
    assert 0.09 <= time.monotonic() - started < 1.0


def test_a_blocking_connect_to_a_backlog_that_stays_full_is_a_connect_error_at_the_limit(
    full_backlog: tuple[str, socket.socket],
) -> None:
    path, _ = full_backlog
    started = time.monotonic()
    with pytest.raises(ConnectError, match="accept backlog is full"):
        SocketStream.connect(path, 0.15)
    assert 0.14 <= time.monotonic() - started < 0.6


def test_a_cancel_ends_a_blocking_connects_wait_at_once(full_backlog: tuple[str, socket.socket]) -> None:
    path, _ = full_backlog
    token = CancelToken()
    timer = threading.Timer(0.05, token.cancel)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(ConnectError, match="cancelled while the server's accept backlog was full"):
            SocketStream.connect(path, 5.0, token)
    finally:
        timer.join()
    assert time.monotonic() - started < 0.15  # the limit is 5 s


def test_a_cancelled_task_ends_an_asyncio_connects_wait_at_once(full_backlog: tuple[str, socket.socket]) -> None:
    path, _ = full_backlog

    async def scene() -> float:
        connecting = asyncio.ensure_future(AsyncSocketStream.connect(path, 5.0))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        connecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        return time.monotonic() - started

    assert asyncio.run(scene()) < 0.1
