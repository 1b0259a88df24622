"""The first-byte limit: a client that sends nothing is closed once the limit runs out, with one
line, and gives its place back; a client that has sent anything (a byte, or only its half-close)
is never timed again.

The proxy runs in-process; the limits here are 150 ms, so the waits are short and bounded.
"""

import socket
import threading
import time
from pathlib import Path

import pytest

from adapters.proxy.options import ProxyLimits
from adapters.proxy.testing import LoopbackUpstream, echo, running_proxy

LIMIT = 0.15
SILENT = f"closed a connection: the client sent no byte within {LIMIT:g} s (first-byte limit)"


def closed_at(client: socket.socket, timeout: float) -> float:
    """When the proxy closed this client (EOF), by `time.monotonic()`; fails after `timeout`."""
    client.settimeout(timeout)
    assert client.recv(1) == b""
    return time.monotonic()


def test_eight_silent_clients_are_closed_when_the_limit_runs_out_and_their_places_are_free_again(
    tmp_path: Path,
) -> None:
    limits = ProxyLimits(max_conns=8, first_byte_timeout=LIMIT)
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, limits) as proxy,
    ):
        started = time.monotonic()
        silent = [proxy.connect() for _ in range(8)]
        try:
            closes = [closed_at(client, timeout=2.0) - started for client in silent]
        finally:
            for client in silent:
                client.close()
        assert proxy.proxy.wait_idle(2)
        with proxy.connect() as newcomer:
            newcomer.settimeout(2)
            newcomer.sendall(b"a place at last")
            assert newcomer.recv(100) == b"a place at last"
    assert min(closes) >= LIMIT and max(closes) < LIMIT + 0.2, closes
    assert proxy.lines == [SILENT] * 8
    assert upstream.accepted == 9  # still one upstream connection per accepted connection


def test_a_client_that_has_sent_a_byte_is_never_timed_again(tmp_path: Path) -> None:
    limits = ProxyLimits(first_byte_timeout=LIMIT)
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, limits) as proxy,
        proxy.connect() as client,
    ):
        client.settimeout(2)
        client.sendall(b"x")
        assert client.recv(1) == b"x"
        client.settimeout(2 * LIMIT)
        with pytest.raises(TimeoutError):
            client.recv(1)  # silent for twice the limit, and still open
        assert proxy.proxy.open_connections == 1
        client.settimeout(2)
        client.sendall(b"still here")
        assert client.recv(100) == b"still here"
    assert proxy.lines == []


def test_a_client_that_only_half_closes_has_said_its_piece_and_gets_a_late_answer(tmp_path: Path) -> None:
    release = threading.Event()
    heard: list[bytes] = []

    def answer_when_released(conn: socket.socket) -> None:
        heard.append(conn.recv(100))  # b"": the half-close was passed on
        release.wait(5)
        conn.sendall(b"late answer")
        conn.shutdown(socket.SHUT_WR)

    limits = ProxyLimits(first_byte_timeout=LIMIT)
    with (
        LoopbackUpstream(answer_when_released) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, limits) as proxy,
        proxy.connect() as client,
    ):
        client.shutdown(socket.SHUT_WR)
        client.settimeout(2 * LIMIT)
        try:
            with pytest.raises(TimeoutError):
                client.recv(1)  # past the limit, waiting for the answer
        finally:
            release.set()
        client.settimeout(2)
        assert client.recv(100) == b"late answer"
        assert client.recv(1) == b""
        upstream.join_handlers(2)
    assert heard == [b""]
    assert proxy.lines == []
    assert not upstream.failures
