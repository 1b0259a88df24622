"""The first-byte limit: a client that sends nothing is closed once the limit runs out, with one
line, and gives its place back; a client that has sent anything (a byte, or only its half-close)
is never timed again.

The proxy runs in-process; the limits here are 150 ms, so the waits are short and bounded.
"""

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from adapters.proxy.options import ProxyLimits
from adapters.proxy.testing import LoopbackUpstream, black_hole, echo, running_proxy

LIMIT = 0.15
SILENT = f"closed a connection: the client sent no byte within {LIMIT:g} s (first-byte limit)"


def closed_at(client: socket.socket, timeout: float) -> float:
    """When the proxy closed this client (EOF, or a reset if data it sent was left unread), by
    `time.monotonic()`; fails after `timeout`."""
    client.settimeout(timeout)
    with contextlib.suppress(ConnectionResetError):
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


@pytest.mark.parametrize("ready_every", [None, 0.05], ids=["connected for the client", "a spare connecting ahead"])
def test_a_silent_client_is_closed_at_the_limit_while_its_upstream_connect_still_hangs(
    tmp_path: Path, ready_every: float | None
) -> None:
    # The connect may take its 2 s: the client, silent, holds its place only as long as the limit.
    limits = ProxyLimits(first_byte_timeout=LIMIT)
    with (
        black_hole() as address,
        running_proxy(str(tmp_path / "p.sock"), address, limits, connect_timeout=2.0, ready_every=ready_every) as proxy,
    ):
        started = time.monotonic()
        with proxy.connect() as client:
            closed = closed_at(client, timeout=2.0) - started
        assert proxy.proxy.wait_idle(2)
    assert LIMIT <= closed < LIMIT + 0.2, closed
    assert proxy.lines == [SILENT]


def test_a_client_that_spoke_while_the_upstream_connect_hangs_waits_for_the_connect(tmp_path: Path) -> None:
    limits = ProxyLimits(first_byte_timeout=LIMIT)
    with (
        black_hole() as address,
        running_proxy(str(tmp_path / "p.sock"), address, limits, connect_timeout=0.4) as proxy,
    ):
        started = time.monotonic()
        with proxy.connect() as client:
            client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            closed = closed_at(client, timeout=2.0) - started
        assert proxy.proxy.wait_idle(2)
    assert closed >= 0.4, closed  # not cut at the first-byte limit: it spoke
    assert [line.partition(" unreachable")[0] for line in proxy.lines] == [f"closed a connection: upstream {address}"]
