"""Floods against the in-process proxy: a stop is never delayed by one, and a stderr that nobody
reads stops neither the forwarding nor the stop.

Every flood here is bounded in count, connects only to the proxy's own Unix socket, and closes
each client it opens at once.
"""

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from adapters.proxy.options import Address, ProxyLimits
from adapters.proxy.server import ACCEPT_BATCH, Proxy
from adapters.proxy.socket_file import bind_socket_file
from adapters.proxy.stderr_log import StderrLog
from adapters.proxy.testing import LoopbackUpstream, ManualClock, echo, fill_pipe, knock

RATE_1 = "accept rate limit (burst 1, refill 2/s)"


@contextmanager
def serving(proxy: Proxy) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=proxy.serve, name="inferproxy-serve")
    thread.start()
    try:
        yield thread
    finally:
        proxy.stop()
        thread.join(5)
        assert not thread.is_alive(), "the proxy did not stop"


class FloodingClock:
    """A frozen clock whose every reading lets one more client into the backlog.

    The proxy reads its clock at least once per accepted client, so the backlog only grows: a
    flood that always outpaces the accept loop, with no timing in it. After `stop_after`
    readings the clock stops the proxy, from inside the loop between two accepts, as a signal
    handler would; from then on it counts the clients that still get a reading in.
    """

    def __init__(self, path: str, *, limit: int, stop_after: int) -> None:
        self.path = path
        self.limit = limit
        self.stop_after = stop_after
        self.proxy: Proxy | None = None
        self.readings = 0
        self.knocks = 0
        self.readings_after_stop = 0
        self.stopped_at: float | None = None

    def __call__(self) -> float:
        if self.proxy is not None:
            self.readings += 1
            if self.stopped_at is not None:
                self.readings_after_stop += 1
            if self.knocks < self.limit and knock(self.path):
                self.knocks += 1
            if self.readings == self.stop_after:
                self.stopped_at = time.monotonic()
                self.proxy.stop()
        return 1000.0


def test_a_stop_in_the_middle_of_a_flood_that_outpaces_the_accept_loop_ends_serving_within_one_accept(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "p.sock")
    flood = FloodingClock(path, limit=5000, stop_after=200)
    lines: list[str] = []
    with LoopbackUpstream(echo) as upstream:
        proxy = Proxy(
            bind_socket_file(path),
            upstream.address,
            ProxyLimits(burst=1),
            clock=flood,
            log=lines.append,
            connect_timeout=2,
        )
        thread = threading.Thread(target=proxy.serve, name="inferproxy-serve")
        thread.start()
        try:
            flood.proxy = proxy
            assert knock(path)  # the first client sets the flood going
            thread.join(5)
            assert flood.stopped_at is not None
            stop_to_return = time.monotonic() - flood.stopped_at
        finally:
            proxy.stop()
            thread.join(5)
        assert not thread.is_alive()
    # Pinned: the flag is read before every accept, so the client being admitted when the stop
    # came is the last one; without that check the loop ran on until the flood's 5000 were in.
    assert flood.readings_after_stop <= 3, flood.readings_after_stop
    assert flood.knocks < 5000
    assert stop_to_return < 0.2, stop_to_return
    assert proxy.accepted < flood.stop_after
    assert ACCEPT_BATCH <= 256  # a wake-up never accepts more than a bounded batch


@contextmanager
def full_pipe() -> Iterator[tuple[int, int, int]]:
    """A pipe already full, as a stderr nobody has read for a while is: (read end, write end, bytes in it)."""
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end, fill_pipe(f"/proc/self/fd/{write_end}")
    finally:
        os.close(read_end)
        os.close(write_end)


def read_lines_until(fd: int, skip: int, want: int, timeout: float) -> list[str]:
    """Read the pipe, skip `skip` bytes of filler, and return the lines once `want` have come."""
    got = b""
    deadline = time.monotonic() + timeout
    while (got[skip:].count(b"\n")) < want:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        got += os.read(fd, 1 << 16)
    return got[skip:].decode().splitlines()


def echoes_within(path: str, timeout: float) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(path)
        try:
            client.sendall(b"ping")
            return client.recv(4) == b"ping"
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            return False  # closed at once by the proxy, before or after the ping went out


def test_with_stderr_full_and_unread_a_flood_of_3000_refusals_neither_stops_forwarding_nor_the_stop(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "p.sock")
    clock = ManualClock()
    with full_pipe() as (r, w, filler), LoopbackUpstream(echo) as upstream:
        log = StderrLog(w)
        limits = ProxyLimits(burst=1, rate=2)
        proxy = Proxy(bind_socket_file(path), upstream.address, limits, clock=clock, log=log, ready_every=None)
        try:
            with serving(proxy) as thread:
                assert echoes_within(path, 2.0)  # spends the one token
                knocked = sum(knock(path) for _ in range(3000))
                # The backlog is served in order: once this one is refused, so is every knock.
                assert not echoes_within(path, 2.0)
                clock.advance(0.5)  # one token again
                assert echoes_within(path, 2.0)
                assert log.pending  # the refusal lines wait in the queue, not in a blocked write
                # Reading makes room; the loop, watching stderr, writes the waiting lines itself.
                lines = read_lines_until(r, filler, 10, 2.0)
                assert lines == [f"inferproxy: refused a connection: {RATE_1}"] * 10
                started = time.monotonic()
                proxy.stop()
                thread.join(5)
                assert time.monotonic() - started < 0.2
            lines = read_lines_until(r, 0, 1, 2.0)
        finally:
            log.close()
    assert knocked == 3000
    more = knocked + 1 - 10  # the knocks and the refused ping, less the ten with a line each
    assert lines == [f"inferproxy: refused {more} more connections within 1 s [{RATE_1}: {more}]"]
    assert upstream.accepted == 2  # the two clients let in, nothing connected ahead


def test_a_line_from_a_connection_thread_into_a_full_stderr_goes_out_once_the_reader_catches_up(
    tmp_path: Path,
) -> None:
    # The line is written on the connection's own thread while the accept loop sleeps in its
    # select: that thread has to wake the loop so it watches stderr for room.
    path = str(tmp_path / "p.sock")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        refused_port = Address("127.0.0.1", probe.getsockname()[1])
    with full_pipe() as (r, w, filler):
        log = StderrLog(w)
        proxy = Proxy(bind_socket_file(path), refused_port, log=log)
        try:
            with serving(proxy):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.settimeout(2)
                    client.connect(path)
                    assert client.recv(1) == b""  # closed: the upstream refused
                assert proxy.wait_idle(2)
                lines = read_lines_until(r, filler, 1, 2.0)
        finally:
            log.close()
    assert len(lines) == 1 and lines[0].startswith(f"inferproxy: closed a connection: upstream {refused_port}")
