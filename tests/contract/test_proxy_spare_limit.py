"""The spare counts against `--max-conns`: it holds an upstream connection (one of llama-server's
HTTP threads, idle until the next client), so the upstream never sees more than the limit open at
once, the spare and any connect under way included. With every place in use there is no spare;
when a client leaves, one is made again and the next client goes up its connection.

Each test runs the proxy as `main` does, with connections made ahead, and the next spare made on
the accept loop's very next turn: a refusal that comes after a client was taken then proves the
loop has already decided whether to make one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adapters.proxy import server
from adapters.proxy.connection import READY_EVERY_S
from adapters.proxy.options import ProxyLimits
from adapters.proxy.testing import (
    LoopbackUpstream,
    RunningProxy,
    black_hole,
    closed,
    echo,
    eventually,
    pending_connects,
    round_trip,
    running_proxy,
)

FULL = "refused a connection: 8 connections already open"
ROOMY_BUCKET = ProxyLimits(burst=100)  # the default 8 places; eleven accepts would empty the default bucket


@pytest.fixture(autouse=True)
def spare_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "SPARE_AFTER_S", 0.0)


def spare_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("inferproxy-") and "-spare" in t.name)


def _closed_by_peer(conn: socket.socket) -> bool:
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Census:
    """An echo upstream that counts its connections open at once, as the kernel has them: one whose
    peer has closed counts no more when the next arrives, even if its own handler has not read the
    EOF yet (its thread and the one that accepts the next race here, not on the proxy's side)."""

    def __init__(self, drop: Callable[[int], bool] = lambda _number: False) -> None:
        self._drop = drop  # by the connection's number: closed at once, as an idle one dropped
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # removed by its handler before the socket is closed
        self._arrived = 0
        self.most = 0

    def __call__(self, conn: socket.socket) -> None:
        with self._lock:
            self._open = {other for other in self._open if not _closed_by_peer(other)}
            self._open.add(conn)
            self.most = max(self.most, len(self._open))
            number, self._arrived = self._arrived, self._arrived + 1
        try:
            if not self._drop(number):
                echo(conn)
        finally:
            with self._lock:
                self._open.discard(conn)


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    clients: list[socket.socket] = []
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def spare_connected(upstream: LoopbackUpstream, clients: int) -> bool:
    """Whether the spare's connection ahead came, after one each for `clients` clients."""
    return eventually(lambda: upstream.accepted == clients + 1)


def refused_while_full(proxy: RunningProxy, refusals: int) -> None:
    """One more client, closed at once with the limit's line, as any client over the limit is."""
    with proxy.connect() as extra:
        assert closed(extra)
    assert proxy.lines == [FULL] * refusals


def test_eight_clients_held_leave_no_place_for_a_spare_and_the_upstream_never_sees_nine(
    tmp_path: Path, held: list[socket.socket]
) -> None:
    census = Census()
    with LoopbackUpstream(census) as upstream:
        path = str(tmp_path / "p.sock")
        with running_proxy(path, upstream.address, ROOMY_BUCKET, ready_every=READY_EVERY_S) as proxy:
            assert ROOMY_BUCKET.max_conns == 8
            for number in range(8):
                held.append(proxy.connect())
                assert round_trip(held[-1], b"held %d" % number) == b"held %d" % number
            refused_while_full(proxy, 1)
            assert spare_threads() == []  # the eighth took the last place: no spare is made
            assert upstream.accepted == 8
            assert census.most == 8

            held.pop().close()
            assert proxy.proxy.wait_open_at_most(7, 2)
            # The place came free: a spare takes it, with its connection made ahead.
            assert eventually(lambda: upstream.accepted == 9)
            held.append(proxy.connect())
            assert round_trip(held[-1], b"next") == b"next"
            assert upstream.accepted == 9  # it went up the spare's connection: no connect of its own
            refused_while_full(proxy, 2)
            assert spare_threads() == []  # the spare it took is not replaced while all eight are in use
            assert upstream.failures == []  # (a stop's abort may reset what is held, so looked at before)
        # Stopped with every place in use: the eight are closed and no spare connects on the way out.
        assert eventually(lambda: upstream.live == 0)
        assert upstream.accepted == 9
        assert census.most == 8


def test_a_spare_whose_connection_the_upstream_dropped_keeps_its_place_and_is_not_replaced(
    tmp_path: Path, held: list[socket.socket]
) -> None:
    census = Census(drop=lambda number: number == 7)  # the one made ahead for the eighth client
    with (
        LoopbackUpstream(census) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ROOMY_BUCKET, ready_every=READY_EVERY_S) as proxy,
    ):
        for number in range(7):
            # Each client comes once the spare's connection is made, so connections are numbered
            # in the clients' order (the spares' threads would connect in any order).
            assert spare_connected(upstream, number)
            held.append(proxy.connect())
            assert round_trip(held[-1], b"held %d" % number) == b"held %d" % number
        assert eventually(lambda: upstream.accepted == 8 and upstream.live == 7)  # the spare's, dropped
        held.append(proxy.connect())
        assert round_trip(held[-1], b"eighth") == b"eighth"  # over a connection made on the spot
        assert upstream.accepted == 9
        refused_while_full(proxy, 1)
        assert spare_threads() == []
        assert census.most == 8
        assert upstream.failures == []


def test_a_spare_still_connecting_when_the_eighth_client_takes_it_is_not_replaced(
    tmp_path: Path, held: list[socket.socket]
) -> None:
    with black_hole() as address:
        others = pending_connects(address)

        def connecting() -> int:
            return len(pending_connects(address) - others)

        def connecting_reaches(count: int) -> bool:
            return eventually(lambda: connecting() == count)

        with running_proxy(str(tmp_path / "p.sock"), address, connect_timeout=5.0, ready_every=READY_EVERY_S) as proxy:
            for number in range(8):
                # The spare's attempt ahead is under way (beside those of the clients before):
                # the next client takes it mid-connect.
                assert connecting_reaches(number + 1)
                held.append(proxy.connect())
            refused_while_full(proxy, 1)
            assert spare_threads() == []
            assert connecting() == 8
