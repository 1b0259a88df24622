"""The proxy's limits: 8 connections at a time, a token bucket on accept, and a flood that leaves
no descriptor or thread behind.

The proxy runs in-process, so its clock is a `ManualClock` and its counts can be read.
"""

import contextlib
import errno
import gc
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from adapters.proxy.options import ProxyLimits
from adapters.proxy.pump import copy_bytes
from adapters.proxy.testing import (
    LoopbackUpstream,
    ManualClock,
    RunningProxy,
    echo,
    eventually,
    round_trip,
    running_proxy,
)

CONNS_FULL = "refused a connection: 8 connections already open"
RATE_REASON = "accept rate limit (burst 10, refill 2/s)"
RATE_LIMITED = f"refused a connection: {RATE_REASON}"


def closed_at_once(client: socket.socket, within: float = 0.2) -> bool:
    """True if the proxy closed this connection within `within` seconds (200 ms) without a byte."""
    client.settimeout(within)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def echoes(proxy: RunningProxy) -> bool:
    with proxy.connect() as client:
        try:
            return round_trip(client, b"ping") == b"ping"
        except (ConnectionResetError, BrokenPipeError):
            return False  # closed at once by the proxy, before or after the ping went out


def test_the_ninth_connection_is_closed_at_once_while_eight_stay_open_and_working(tmp_path: Path) -> None:
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=8, burst=10, rate=2)) as proxy,
    ):
        eight = [proxy.connect() for _ in range(8)]
        try:
            assert [round_trip(c, b"hello %d" % i) for i, c in enumerate(eight)] == [b"hello %d" % i for i in range(8)]
            with proxy.connect() as ninth:
                assert closed_at_once(ninth)
            assert proxy.lines == [CONNS_FULL]
            # The eight are untouched by the refusal.
            assert [round_trip(c, b"again %d" % i) for i, c in enumerate(eight)] == [b"again %d" % i for i in range(8)]
            assert proxy.proxy.open_connections == 8
            eight.pop().close()
            assert proxy.proxy.wait_open_at_most(7, 2)
            with proxy.connect() as tenth:  # a freed place is usable again
                assert round_trip(tenth, b"in") == b"in"
        finally:
            for client in eight:
                client.close()
    assert upstream.accepted == 9


def test_a_client_that_finds_a_connection_ending_gets_its_place_instead_of_a_refusal(tmp_path: Path) -> None:
    # Each connection's threads are held after its client's close until the next client has
    # been accepted, as a busy machine would hold them: that client still gets in, once they end.
    stamp: list[RunningProxy] = []
    done = threading.Event()

    def late_to_notice(src: socket.socket, dst: socket.socket) -> None:
        seen = stamp[0].proxy.accepted
        copy_bytes(src, dst)
        if src.family == socket.AF_UNIX:  # (the last one: until the test is done)
            eventually(lambda: stamp[0].proxy.accepted > seen or done.is_set())

    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(
            str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=1, burst=10, rate=2), mover=late_to_notice
        ) as proxy,
    ):
        stamp.append(proxy)
        for i in range(3):
            with proxy.connect() as client:
                assert round_trip(client, b"turn %d" % i) == b"turn %d" % i
        done.set()
        assert proxy.lines == []
    assert upstream.accepted == 3


def test_a_connection_that_does_not_end_in_time_leaves_the_newcomer_refused(tmp_path: Path) -> None:
    ended = threading.Event()

    def never_notices(src: socket.socket, dst: socket.socket) -> None:
        copy_bytes(src, dst)
        if src.family == socket.AF_UNIX:
            ended.wait(5)

    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(
            str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=1, burst=10, rate=2), mover=never_notices
        ) as proxy,
    ):
        try:
            with proxy.connect() as first:
                assert round_trip(first, b"one") == b"one"
            with proxy.connect() as second:  # refused once the wait for the ending one is over
                assert closed_at_once(second, within=1.0)
            assert proxy.lines == [CONNS_FULL.replace("8 connections", "1 connections")]
        finally:
            ended.set()


def test_a_half_closed_client_keeps_its_place_while_its_answer_may_still_come(tmp_path: Path) -> None:
    answered = threading.Event()

    def answers_later(conn: socket.socket) -> None:
        while conn.recv(1024):
            pass
        answered.wait(5)
        conn.sendall(b"late")

    with (
        LoopbackUpstream(answers_later) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=1, burst=10, rate=2)) as proxy,
        proxy.connect() as first,
    ):
        first.sendall(b"one")
        first.shutdown(socket.SHUT_WR)  # done sending, still reading: the connection is not over
        assert eventually(lambda: upstream.live == 1)
        with proxy.connect() as second:
            assert closed_at_once(second)
        assert proxy.lines == [CONNS_FULL.replace("8 connections", "1 connections")]
        answered.set()
        first.settimeout(2)
        assert first.recv(16) == b"late"


def test_ten_connections_are_accepted_in_a_burst_and_then_about_two_per_second(tmp_path: Path) -> None:
    clock = ManualClock()
    limits = ProxyLimits(max_conns=100, burst=10, rate=2)
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, limits, clock=clock) as proxy,
    ):
        assert [echoes(proxy) for _ in range(11)] == [True] * 10 + [False]
        clock.advance(0.25)
        assert not echoes(proxy)
        clock.advance(0.25)
        assert [echoes(proxy) for _ in range(2)] == [True, False]
        clock.advance(1.0)
        assert [echoes(proxy) for _ in range(3)] == [True, True, False]
        clock.advance(60)
        assert [echoes(proxy) for _ in range(11)] == [True] * 10 + [False]
    assert proxy.lines == [RATE_LIMITED] * 5
    assert upstream.accepted == 10 + 1 + 2 + 10


def test_an_attempt_refused_for_a_full_house_still_spends_a_token(tmp_path: Path) -> None:
    # Pinned on purpose: the bucket rations accept attempts, so a client retrying in a loop
    # while all places are taken is slowed down too.
    clock = ManualClock()
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(
            str(tmp_path / "p.sock"), upstream.address, ProxyLimits(max_conns=1, burst=3, rate=2), clock=clock
        ) as proxy,
        proxy.connect() as held,
    ):
        assert round_trip(held, b"x") == b"x"
        refusals = [proxy.connect() for _ in range(3)]
        try:
            assert all(closed_at_once(c) for c in refusals)
        finally:
            for c in refusals:
                c.close()
    assert proxy.lines == [
        "refused a connection: 1 connections already open",
        "refused a connection: 1 connections already open",
        "refused a connection: accept rate limit (burst 3, refill 2/s)",
    ]


def open_descriptors() -> int:
    """Open descriptors, once the garbage a test before left (a socket in a reference cycle) is
    collected: else one closing mid-test would read as this test's."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def live_threads() -> tuple[int, int]:
    """Python threads, and the kernel's tasks once they match them.

    A joined Python thread can linger in /proc/self/task for a moment while its OS thread exits,
    and that exit signals nothing to wait on, so the kernel count is polled briefly.
    """
    python_threads = threading.active_count()
    deadline = time.monotonic() + 1.0
    while (tasks := len(os.listdir("/proc/self/task"))) > python_threads and time.monotonic() < deadline:
        time.sleep(0.001)
    return python_threads, tasks


def join_connection_threads() -> None:
    # The spare's threads wait for the next client, before and after alike: they are not joined.
    for thread in threading.enumerate():
        if thread.name.startswith("inferproxy-") and thread.name != "inferproxy-serve" and "-spare" not in thread.name:
            thread.join(2)


def abandon(client: socket.socket) -> None:
    """Leave without reading what came back, so the proxy sees the connection reset."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def flood_handler(conn: socket.socket) -> None:
    """Echo, except that a request starting with R is answered with a TCP reset."""
    first = conn.recv(64)
    if first.startswith(b"R"):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return
    conn.sendall(first)
    # An abandoned client: the proxy passes the failure on as a reset or a dead socket.
    with contextlib.suppress(OSError):
        echo(conn)


def test_descriptor_and_thread_counts_are_the_same_before_and_after_a_flood_of_2000_connections(
    tmp_path: Path,
) -> None:
    # Each round opens 20 connections at once: the bucket, refilled to 10 by the clock, admits
    # ten attempts; of those, 8 get a place and 2 meet the connection limit; the last 10 meet the
    # rate limit. Of the 8 forwarded, 4 echo and close cleanly, 1 half-closes and reads to the
    # end, 2 are abandoned by the client with unread data, 1 is reset by the upstream. Of the 12
    # refusals, the first 10 get a line each and the last 2 one summary line, written once the
    # clock has moved on (at the next round, or at the stop for the last round).
    clock = ManualClock()
    rounds = 100  # 100 * 20 = 2000 connections
    with (
        LoopbackUpstream(flood_handler) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, clock=clock) as proxy,
    ):
        assert echoes(proxy)
        assert proxy.proxy.wait_idle(2)
        upstream.join_handlers(2)
        join_connection_threads()
        fds_before, threads_before = open_descriptors(), live_threads()

        outcomes = {"echoed": 0, "half-closed": 0, "abandoned": 0, "reset": 0, "refused": 0}
        for _ in range(rounds):
            clock.advance(5.0)
            clients = [proxy.connect() for _ in range(20)]
            try:
                # Refusals first: while the first 8 are all still open, the proxy must refuse the
                # rest whenever it gets to accepting them.
                # The flood counts outcomes; promptness is the ninth-connection test's job, so a
                # scheduling hiccup on a busy machine gets a generous bound here.
                outcomes["refused"] += sum(closed_at_once(client, within=2.0) for client in clients[8:])
                for client in clients[:4]:
                    if round_trip(client, b"E hello") == b"E hello":
                        outcomes["echoed"] += 1
                half = clients[4]
                half.sendall(b"E bye")
                half.shutdown(socket.SHUT_WR)
                half.settimeout(2)
                if half.recv(64) == b"E bye" and half.recv(64) == b"":
                    outcomes["half-closed"] += 1
                for client in clients[5:7]:
                    client.sendall(b"E gone")
                for client in clients[7:8]:
                    client.sendall(b"R")
                    client.settimeout(2)
                    if client.recv(64) == b"":
                        outcomes["reset"] += 1
            finally:
                for client in clients[5:7]:
                    abandon(client)
                    outcomes["abandoned"] += 1
                for client in clients:
                    client.close()
            assert proxy.proxy.wait_idle(2)

        upstream.join_handlers(5)
        join_connection_threads()
        fds_after, threads_after = open_descriptors(), live_threads()
    lines = list(proxy.lines)

    assert outcomes == {
        "echoed": 4 * rounds,
        "half-closed": rounds,
        "abandoned": 2 * rounds,
        "reset": rounds,
        "refused": 12 * rounds,
    }
    assert lines.count(CONNS_FULL) == 2 * rounds
    assert lines.count(RATE_LIMITED) == 8 * rounds
    assert lines.count(f"refused 2 more connections within 1 s [{RATE_REASON}: 2]") == rounds
    assert len(lines) == 11 * rounds
    assert upstream.accepted == 1 + 8 * rounds
    assert not upstream.failures
    assert (fds_after, threads_after) == (fds_before, threads_before)


def test_accepts_that_fail_say_so_once_a_second_with_how_many_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Out of descriptors, the backlog is tried again every 50 ms: a line each time would flood
    # the log for as long as the shortage lasts.
    real_accept = socket.socket.accept

    def accept(self: socket.socket) -> tuple[socket.socket, object]:
        if self.family == socket.AF_UNIX:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(self)

    clock = ManualClock()
    with (
        LoopbackUpstream(echo) as upstream,
        running_proxy(str(tmp_path / "p.sock"), upstream.address, clock=clock) as proxy,
    ):
        monkeypatch.setattr(socket.socket, "accept", accept)
        waiting = proxy.connect()
        try:
            assert eventually(lambda: any("accept failed" in line for line in proxy.lines))
            assert eventually(lambda: proxy.proxy._accept_failures >= 3)  # tried again, said nothing
            assert [line for line in proxy.lines if "accept failed" in line] == ["accept failed: Too many open files"]
            clock.advance(1.0)
            assert eventually(lambda: len([line for line in proxy.lines if "accept failed" in line]) == 2)
            second = [line for line in proxy.lines if "accept failed" in line][1]
            assert (
                second.startswith("accept failed: Too many open files (") and "more since the last such line" in second
            )
        finally:
            monkeypatch.undo()
            waiting.close()
