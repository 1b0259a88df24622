"""The spare's upstream connection made ahead (`Connection._keep_ready`, `forward_first`): the
next client's bytes go up a connection that already exists, one the upstream dropped is never
used, the attempts come at most once a period, and none of it outlives the proxy or holds up
its stop. Each test runs the proxy as `main` does, with connections made ahead."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.proxy import server
from adapters.proxy.connection import READY_EVERY_S
from adapters.proxy.testing import (
    LoopbackUpstream,
    black_hole,
    closed,
    echo,
    eventually,
    pending_connects,
    round_trip,
    running_proxy,
    unused_port,
)

PERIOD = 0.1


class Recording:
    """An echo upstream that numbers its connections and notes when each came and what it got."""

    def __init__(self, drop: Callable[[int], bool] = lambda _n: False) -> None:
        self._drop = drop
        self._lock = threading.Lock()
        self.came: list[float] = []
        self.heard: dict[int, bytes] = {}

    def __call__(self, conn: socket.socket) -> None:
        with self._lock:
            number = len(self.came)
            self.came.append(time.monotonic())
        if self._drop(number):
            return  # closed at once, unread, as an upstream that drops idle connections does
        got = b""
        while data := conn.recv(65536):
            got += data
            conn.sendall(data)
        with self._lock:
            self.heard[number] = got


def send_and_half_close(client: socket.socket, payload: bytes) -> None:
    client.sendall(payload)
    client.shutdown(socket.SHUT_WR)


def test_main_makes_connections_ahead_every_period_below_llama_servers_five_seconds() -> None:
    assert 0 < READY_EVERY_S < 5.0


def test_a_spare_connects_ahead_and_its_client_goes_up_that_very_connection(tmp_path: Path) -> None:
    recording = Recording()
    with (
        LoopbackUpstream(recording) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=READY_EVERY_S) as proxy,
    ):
        assert eventually(lambda: upstream.accepted == 1, 2.0)  # before any client
        assert proxy.proxy.open_connections == 0  # a spare's, with no client yet
        with proxy.connect() as client:
            assert round_trip(client, b"ping") == b"ping"
        assert proxy.proxy.wait_idle(2)
        assert eventually(lambda: 0 in recording.heard, 2.0)
    assert recording.heard[0] == b"ping"  # the first connection, made before the client came
    assert proxy.lines == []


def test_a_ready_connection_the_upstream_dropped_is_never_used_and_the_client_gets_its_own(tmp_path: Path) -> None:
    recording = Recording(drop=lambda number: number == 0)
    with (
        LoopbackUpstream(recording) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=READY_EVERY_S) as proxy,
    ):
        # Dropped: closed on the upstream's side (so the proxy can see it) before the client comes.
        # One dropped at the very moment a request goes up takes the request with it, as a restart
        # would; with llama-server (5 s) the proxy's own period (4 s) comes first.
        assert eventually(lambda: upstream.accepted == 1 and upstream.live == 0, 2.0)
        with proxy.connect() as client:  # whether the proxy's second thread saw the drop yet or not
            assert round_trip(client, b"not lost") == b"not lost"
        assert proxy.proxy.wait_idle(2)
        assert eventually(lambda: 1 in recording.heard, 2.0)
    assert recording.heard[1] == b"not lost"
    assert 0 not in recording.heard
    assert proxy.lines == []


def test_a_spare_connects_again_each_period_and_its_client_takes_the_latest(tmp_path: Path) -> None:
    recording = Recording()
    with (
        LoopbackUpstream(recording) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=PERIOD) as proxy,
    ):
        assert eventually(lambda: upstream.accepted >= 3, 2.0)
        assert proxy.proxy.open_connections == 0
        assert eventually(lambda: 1 in recording.heard, 2.0)  # the one before was closed, unused
        with proxy.connect() as client:
            assert round_trip(client, b"after three") == b"after three"
        assert proxy.proxy.wait_idle(2)
        assert eventually(lambda: b"after three" in recording.heard.values(), 2.0)
    gaps = [later - earlier for earlier, later in zip(recording.came, recording.came[1:], strict=False)]
    assert min(gaps[:2]) >= PERIOD * 0.9, gaps  # one attempt a period, not a loop
    assert recording.heard[0] == recording.heard[1] == b""  # replaced unused, nothing sent on them


def test_an_upstream_that_drops_every_connection_at_once_gets_one_attempt_a_period(tmp_path: Path) -> None:
    recording = Recording(drop=lambda _number: True)
    with (
        LoopbackUpstream(recording) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=PERIOD) as proxy,
    ):
        assert eventually(lambda: upstream.accepted >= 3, 2.0)
        seen = upstream.accepted
        started = recording.came[0]
        elapsed = time.monotonic() - started
    assert seen <= elapsed / PERIOD + 2, (seen, elapsed)  # not a reconnect loop
    assert proxy.lines == []


def test_an_unreachable_upstream_gives_the_client_one_line_and_the_attempts_ahead_none(tmp_path: Path) -> None:
    address = unused_port()
    with running_proxy(str(tmp_path / "p.sock"), address, ready_every=PERIOD) as proxy:
        for _ in range(2):  # the second finds a spare that has tried ahead (and failed) meanwhile
            with proxy.connect() as client:
                client.settimeout(2)
                # The second may be closed before it sends: the spare already knows the upstream is down.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
                assert closed(client)
            assert proxy.proxy.wait_idle(2)
    assert len(proxy.lines) == 2, proxy.lines
    assert all(line.startswith(f"closed a connection: upstream {address} unreachable") for line in proxy.lines)


def test_a_stop_ends_serving_within_100_ms_while_the_spare_connects_ahead_into_a_black_hole(tmp_path: Path) -> None:
    with black_hole() as address:
        others = pending_connects(address)
        with running_proxy(str(tmp_path / "p.sock"), address, connect_timeout=5.0, ready_every=PERIOD) as proxy:
            assert eventually(lambda: len(pending_connects(address) - others) == 1, 2.0)
            started = time.monotonic()
        elapsed = time.monotonic() - started
        assert elapsed < 0.1, f"{elapsed * 1000:.0f} ms from the stop to the end of serving"
        assert pending_connects(address) <= others
    assert proxy.lines == []


def test_requests_of_every_size_go_up_whole_from_the_accepting_thread_and_the_first(tmp_path: Path) -> None:
    # The accepting thread moves what has come by the accept (at most FIRST_READ bytes, what the
    # socket takes at once); the first thread sends the rest of that, then moves the remainder.
    recording = Recording()
    sizes = [1, 4096, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 3 * 1024 * 1024 + 7]
    with (
        LoopbackUpstream(recording) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ready_every=READY_EVERY_S) as proxy,
    ):
        for size in sizes:
            payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            assert eventually(lambda: upstream.live >= 1, 2.0)  # a connection ready for it
            with proxy.connect() as client:
                # Sent at once, before the proxy's accept as far as the socket holds it.
                sender = threading.Thread(target=send_and_half_close, args=(client, payload))
                sender.start()
                client.settimeout(5)
                back = b""
                while chunk := client.recv(1 << 20):
                    back += chunk
                sender.join(5)
            assert back == payload
            assert proxy.proxy.wait_idle(2)
        assert eventually(lambda: len(recording.heard) >= len(sizes), 2.0)
    assert sorted(len(got) for got in recording.heard.values() if got) == sizes


def test_a_client_that_comes_while_the_connection_ahead_is_made_waits_for_it_not_for_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first client of a new proxy comes while its spare's first attempt may be under way:
    # it takes that connection, so an upstream that accepts one connection serves it. (The next
    # spare, with its own connection ahead, is put off for the test.)
    monkeypatch.setattr(server, "SPARE_AFTER_S", 60.0)
    for attempt in range(20):
        with (
            LoopbackUpstream(echo) as upstream,
            running_proxy(str(tmp_path / f"p{attempt}.sock"), upstream.address, ready_every=READY_EVERY_S) as proxy,
        ):
            with proxy.connect() as client:
                assert round_trip(client, b"first") == b"first"
            assert upstream.accepted == 1, attempt
